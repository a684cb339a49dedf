"""calctl: bring-up and serving toolkit for calbin packages on a Calculet NPU board.

The mock device is the default everywhere; a real board is reached through the
CalRT ctypes layer (``--device calrt``).
"""

__version__ = "0.1.0"
