"""Developer tools: the local demo cluster (``make run``) and the real-GPU check."""
