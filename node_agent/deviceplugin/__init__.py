"""The kubelet device plugin for ``edgegpu.io/gpu-mem-block``, served by the agent.

The plugin service and its server, the devices kubelet is told of, kubelet's PodResources
client, what the agent keeps across restarts, and the generated gRPC modules (``make proto``).
"""
