"""`GET /v1/jobs/{id}/report` (issue 27): the page is built once per state of the job's study and
served from the cache (with its ETag, gzipped when accepted, 304 when unchanged), and it stays
self-contained: no script, style or image from anywhere else."""

from __future__ import annotations

import gzip
import re

import pytest

from api.routes.jobs import accepts_gzip
from tests.api.conftest import Finished
from tests.api.helpers import AUTH, OTHER_AUTH

EXTERNAL = re.compile(r"""<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=\s*["']?(https?:)?//""")


def test_the_report_is_built_once_and_served_from_the_cache(finished: Finished) -> None:
    client, url = finished.client, finished.job["links"]["report"]
    reports = client.app.state.services.reports  # type: ignore[attr-defined]
    plain = {"Accept-Encoding": "identity"}
    first = client.get(url, headers=AUTH | plain)
    built = reports.built
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/html")
    assert "content-encoding" not in first.headers
    for _ in range(3):
        again = client.get(url, headers=AUTH | plain)
        assert again.content == first.content and again.headers["etag"] == first.headers["etag"]
    assert reports.built == built  # served from the cache, not built again
    assert first.headers["cache-control"] == "private, no-cache"


def test_the_report_stays_self_contained(finished: Finished) -> None:
    page = finished.client.get(finished.job["links"]["report"], headers=AUTH).text
    assert "Plotly.newPlot" in page and "<script" in page
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert EXTERNAL.search('<script src="https://cdn.plot.ly/plotly.js"></script>')  # it can fail


def test_the_report_is_gzipped_when_accepted_and_304_when_unchanged(finished: Finished) -> None:
    client, url = finished.client, finished.job["links"]["report"]
    plain = client.get(url, headers=AUTH | {"Accept-Encoding": "identity"})
    zipped = client.get(url, headers=AUTH | {"Accept-Encoding": "gzip, deflate"})
    assert zipped.headers["content-encoding"] == "gzip" and zipped.content == plain.content
    assert int(zipped.headers["content-length"]) < len(plain.content) / 2
    assert (
        gzip.decompress(
            client.app.state.services.reports.page(  # type: ignore[attr-defined]
                finished.job["study"]
            ).gzipped
        )
        == plain.content
    )
    refused = client.get(url, headers=AUTH | {"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in refused.headers
    unchanged = client.get(url, headers=AUTH | {"If-None-Match": zipped.headers["etag"]})
    assert unchanged.status_code == 304 and unchanged.content == b""
    assert client.get(url, headers=AUTH | {"If-None-Match": '"other"'}).status_code == 200


def test_each_encoding_has_its_own_etag_and_if_none_match_is_read_as_a_list(
    finished: Finished,
) -> None:
    """A cache that kept the gzipped page must not have an identity request's If-None-Match
    answered 304 with it (RFC 9110 8.8.3); `*`, weak tags and lists match as RFC 9110 13.1.2
    says."""
    client, url = finished.client, finished.job["links"]["report"]
    identity = AUTH | {"Accept-Encoding": "identity"}
    plain = client.get(url, headers=identity).headers["etag"]
    zipped = client.get(url, headers=AUTH | {"Accept-Encoding": "gzip"}).headers["etag"]
    # Weak: two builds of one study state differ in the time each page says it was made (two
    # servers on one database gave one strong tag for different bytes, a probe, 2026-12-07).
    assert plain != zipped and plain.startswith('W/"') and zipped.endswith('-gzip"')
    assert client.get(url, headers=identity | {"If-None-Match": zipped}).status_code == 200
    bare = plain.removeprefix("W/")
    for header in (plain, bare, f'"other", {plain}', f'"other", {bare}', "*"):
        answer = client.get(url, headers=identity | {"If-None-Match": header})
        assert answer.status_code == 304 and answer.headers["etag"] == plain, header
    assert (
        client.get(url, headers=identity | {"If-None-Match": plain[:-2] + '"'}).status_code == 200
    )
    assert client.get(url, headers=OTHER_AUTH).status_code == 404  # not its job


@pytest.mark.parametrize(
    ("header", "takes"),
    [
        ("gzip", True),
        ("*;q=0, gzip", True),  # gzip named: its own weight, wherever `*` stands
        ("gzip;q=0, *", False),
        ("*", True),
        ("*;q=0", False),
        ("identity, *;q=0.5", True),
        ("gzip; q=0.001", True),
        ("GZIP;Q=0", False),
        ("gzip;q=x", False),
        ("deflate, br", False),
        ("", False),
    ],
)
def test_accept_encoding_weights_decide_gzip(header: str, takes: bool) -> None:
    assert accepts_gzip(header) is takes
