"""Running Sluice on this machine: an embedded AWS (moto server), the deploy path into it, and the demo.

Nothing here runs in Lambda. It needs the development dependencies (moto with its server extra,
rich, matplotlib) and, to package the stack, Node.js with the npm packages of ``package-lock.json``.
"""
