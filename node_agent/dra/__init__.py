"""kubelet's Dynamic Resource Allocation plugin for the driver ``gpu.edgegpu.io``."""
