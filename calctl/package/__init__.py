"""The calbin package contract: typed model, strict reader, archive handling.

See docs/package-format.md for the format, field by field.
"""

from calctl.package.model import Package  # noqa: F401
from calctl.package.reader import open_package, package_root  # noqa: F401
