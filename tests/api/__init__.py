import warnings

# starlette's TestClient would rather have httpx2; httpx works, and the warning is noise here.
warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient`")
