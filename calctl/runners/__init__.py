"""Device runners: golden, warm-up, the combined-calbin PoC, soak, bench and bring-up.

Each runner takes an open runtime and a validated package, produces a report
object that names the device, runtime version, package digest and signer, and
never claims more than it measured.
"""
