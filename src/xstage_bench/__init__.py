"""X-Stage bench: reproducible benchmarks of device-initiated communication on multi-GPU nodes."""

__version__ = "0.1.0"
