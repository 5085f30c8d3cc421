"""The one folder weft keeps caches in: RTL simulation builds (``rtl/``) and synthesis results (``synth/``).

``$WEFT_CACHE`` when set, else ``$XDG_CACHE_HOME/weft``, else ``~/.cache/weft``: never beside the installed
package (site-packages may be read-only, and is shared by every user). Everything in it can be deleted; it is
rebuilt on demand. Outputs a command is asked for (``weft demo``'s files, ``weft bitstream`` projects) go to
the current folder or ``-o``, never here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(kind: str | None = None) -> Path:
    """The cache folder, or its subfolder `kind` ("rtl", "synth"); not created here."""
    if os.environ.get("WEFT_CACHE"):
        root = Path(os.environ["WEFT_CACHE"]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "weft"
    else:
        root = Path.home() / ".cache" / "weft"
    return root / kind if kind else root
