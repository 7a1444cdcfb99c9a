"""servehall-ascend-stub: the NPU adapter (Ascend via torch_npu) for the shared torch engine.

Backends: ``ascend`` (a real NPU through ``torch_npu``; unavailable with a reason
elsewhere) and ``ascend-simulated`` (the same adapter code on the host CPU, for
conformance tests; never chosen by ``auto``).
"""
