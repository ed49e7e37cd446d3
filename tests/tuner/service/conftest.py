"""The service's tests drive real workers through the API's routes (a job is submitted the way a
user submits one); they share the API tests' fixtures."""

from tests.api.conftest import client, finished, storage

__all__ = ["client", "finished", "storage"]
