"""The kdrl service: the composition root (HTTP, Kubernetes adapters, OpenTelemetry, CLI).

Nothing imports `plugin`; it imports everything else and wires it together.
"""

import os as _os
from pathlib import Path as _Path

# statsforecast's and our numba kernels compile once and are cached on disk; numba reads this
# when first imported, which is below this package, so it is set here, at the entrypoint.
_os.environ.setdefault("NUMBA_CACHE_DIR", str(_Path.home() / ".cache" / "kdrl" / "numba"))
