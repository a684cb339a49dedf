"""Sealing packages: checksums, detached Ed25519 signatures, trust stores.

Pure library used by ``calctl pack/sign/verify``, the validator and the server's
load path. Nothing here prints.
"""
