"""The reference mock compiler: it writes complete, sealed calbin packages.

``sample`` builds the bundled tiny sample packages (``calctl sample-package``),
``bundled`` caches them for commands given no package, ``elfwriter`` writes the
per-(CalCore, chip) ELF programs. This folder sits above the package contract
(``calctl.package``) and the model code (``calctl.model``): it imports both and
neither imports it. It does not validate what it writes; ``calctl validate``
does.
"""
