"""edgegpu node agent: samples every GPU, protects it locally, exports metrics, pushes telemetry."""

__version__ = "0.1.0"
