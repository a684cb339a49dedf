"""The CalRT backend: ctypes over the C ABI of docs/calrt-c-abi.md (``lib``: declarations, ``backend``: the Runtime)."""
