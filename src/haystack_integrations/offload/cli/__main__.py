"""``python -m haystack_integrations.offload.cli``: the ``offload-haystack`` command."""

from haystack_integrations.offload.cli import run

if __name__ == "__main__":  # not when a tool walks the package and imports every module
    run()
