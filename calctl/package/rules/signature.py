"""Signature rules (SIG): checksums.sha256 is signed by a trusted key.

The trust store is the caller's (``--trusted-key``, ``$CALCTL_TRUSTED_KEYS``,
the test-only key for the bundled sample); this module does not load keys.
"""

from __future__ import annotations

from collections.abc import Iterator

from calctl.package.rules.base import Finding, Rule, Severity
from calctl.package.rules.context import ValidationContext
from calctl.signing.files import SIGNATURE
from calctl.signing.policy import TEST_KEY_NAME, test_public_key


class TrustedSignature(Rule):
    """checksums.sha256.sig is a valid Ed25519 signature over checksums.sha256 by a trusted key.

    Chip selection comes entirely from signed, validated metadata (001 §6.4: SubmitJob has no chip argument), and a load
    must verify signature and hashes before anything else (000 §11 step 2). The detached signature is the raw 64-byte
    Ed25519 signature over the exact bytes of checksums.sha256, checked against every trusted key (--trusted-key,
    repeatable, and every *.pub in $CALCTL_TRUSTED_KEYS). An unsigned package, a signature by an untrusted key, or a
    checksums file changed after signing fails; with --allow-unsigned the same finding is reported as a warning, never
    silently.
    """

    id = "SIG001"
    sections = ("docs/package-format.md", "001 §6.3", "001 §6.4", "000 §11 step 2", "001 §11")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        state = ctx.signature
        if state.signer is not None:
            yield self.note(f"signed by trusted key {state.signer.key_id} ({state.signer.source})")
            return
        message = str(state.problem)
        if ctx.policy.trust.allow_unsigned:
            yield self.warning(f"{message}; accepted because --allow-unsigned was given", file=SIGNATURE)
        else:
            yield self.problem(message, file=SIGNATURE)


class NotTestKey(Rule):
    """The package is not signed by the published test-only key (a warning: fine for the mock device only).

    calctl-test-only-DO-NOT-TRUST.key is published so that sample packages and fixtures work anywhere; anyone can sign
    anything with it. A package whose signature verifies with it is accepted (it is in the trust store because the
    caller put it there, or because the bundled sample is in use) but is reported as a warning: such a package proves
    nothing about who built it and must never be loaded on a real board (docs/runtime.md §5: claims are labelled for
    what they are). --fail-on-warn turns this into a rejection.
    """

    id = "SIG002"
    severity = Severity.WARNING
    sections = ("docs/runtime.md §5", "001 §1")

    def check(self, ctx: ValidationContext) -> Iterator[Finding]:
        signer = ctx.signature.signer
        if signer is None:
            yield self.note("no trusted signer to compare (SIG001 reports the signature)")
            return
        if signer.key_id == test_public_key().key_id:
            yield self.problem(
                f"signed by the published test-only key {TEST_KEY_NAME} ({signer.key_id}); "
                "acceptable for the mock device, never for a board",
                file=SIGNATURE,
            )
            return
        yield self.note(f"signer {signer.key_id} is not the published test-only key")


RULES: tuple[type[Rule], ...] = (TrustedSignature, NotTestKey)
