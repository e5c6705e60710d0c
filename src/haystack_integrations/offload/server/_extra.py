"""The message for a missing ``server`` extra, raised by the modules that import the web dependencies."""

SERVER_EXTRA_HINT = (
    'The offload-haystack server needs FastAPI, uvicorn and pydantic-settings: pip install "offload-haystack[server]"'
)
