"""``sharnn decompress -l FILE.shz`` and ``sharnn info FILE.shz``: :func:`list_file` reads
what a compressed file says about itself (its header, checked, and its sizes) without
decoding it, and :class:`Listing` is the block the commands print.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..coding.container import MAGIC, MAX_FILE_BYTES, Header, parse
from ..files import read_input
from .decompress import shipped_name


@dataclass(frozen=True)
class Listing:
    """A compressed file's ``name``, format ``version``, checked ``header``, size in bytes
    (``size``) and the ``shipped`` model whose fingerprint it records (None: none is, or an
    online file)."""

    name: str
    version: int
    header: Header
    size: int
    shipped: str | None

    def format(self) -> str:
        """The lines ``sharnn decompress -l`` and ``sharnn info`` print."""
        return "\n".join([f"{self.name}:"] + [f"  {key + ':':<16}{value}" for key, value in self.rows().items()])

    def rows(self) -> dict[str, str]:
        """What :meth:`format` shows, by row name ("model", "arithmetic", "coded on", ...)."""
        header = self.header
        return {
            "format version": str(self.version),
            "model": self._model(),
            "streams": f"{header.streams}",
            "original": f"{header.length:,} bytes",
            **({"line ends": f"CRLF, coded as LF ({header.crlf:,} folded)"} if header.crlf else {}),
            **({"input": "not text: coded by the context models alone"} if not header.model_input else {}),
            "compressed": f"{self.size:,} bytes" + self._ratio(),
            "arithmetic": self._arithmetic(),
            "storage": "coded"
            if header.storage == "coded"
            else f"stored raw (coding gave {header.coded_bytes:,} bytes; decodes without the model)",
            "coded on": self._environment(),
        }

    def _model(self) -> str:
        header = self.header
        if header.mode == "online":
            settings = ", ".join(f"{k}={v}" for k, v in (header.online or {}).items() if k != "model")
            return f"online (a fixed-seed model learns the file: {settings}), sha256 {header.model_sha256}"
        which = f"{self.shipped} (shipped)" if self.shipped else "not shipped (decompress with --model)"
        return f"{which}, sha256 {header.model_sha256}"

    def _ratio(self) -> str:
        length = self.header.length
        if not length:
            return " (an empty original: no ratio, no bits per byte)"
        return f", ratio {self.size / length:.3f}, {8 * self.size / length:.4f} bits per byte"

    def _arithmetic(self) -> str:
        header = self.header
        parts = [f"integer step {header.integer_step}"] if header.integer_step is not None else []
        parts.append(f"mixing {header.mixing}" if header.mixing is not None else "no mixing")
        travels = "portable" if header.portable else "decodes on the same kind of machine only"
        return f"{header.precision} ({', '.join(parts)}), {travels}"

    def _environment(self) -> str:
        env = self.header.environment
        threads = env.get("threads")
        parts = [str(env.get("device")), f"torch {env.get('torch')}", f"{threads} thread{'s' * (threads != 1)}"]
        parts += [str(env[key]) for key in ("cpu_capability", "gpu") if env.get(key)]
        if env.get("cpu_features"):
            parts.append(" ".join(env["cpu_features"]))
        return ", ".join(parts)


def list_file(source: str | Path) -> Listing:
    """What the compressed file ``source`` says about itself, its header and payload checked
    against their CRC32s (nothing is decoded).

    Raises:
        DataError: as :func:`sharnn.coding.container.read_header`; an unreadable ``source``.
    """
    blob = read_input(source, MAX_FILE_BYTES, "the most sharnn decompresses")
    version, header, _ = parse(blob, str(source))
    shipped = shipped_name(header.model_sha256) if header.mode == "model" and header.storage == "coded" else None
    return Listing(str(source), version, header, len(blob), shipped)


def is_compressed(path: str | Path) -> bool:
    """Whether ``path`` is a file that opens as sharnn's compressed files do (its magic)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False
