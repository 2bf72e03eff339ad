"""The check catalogue: every stable finding code and what it means.

Codes are like a linter's rules: CI pipelines grep them, so a code is never
renumbered or reused. `docs/checks.md` is generated from this table
(`python -m power.orchestrator.codes > docs/checks.md`; a test keeps it in step).

Families: PWR0xx files and schema; PWR1xx artifacts; PWR2xx drafters;
PWR3xx tokenizer identity; PWR4xx speculation settings; PWR5xx memory.
Each family's owner adds its rows in its own section below.
"""

from __future__ import annotations

# code -> (default severity, title)
CODES: dict[str, tuple[str, str]] = {
    # --- PWR0xx: files, TOML, schema ---------------------------------------
    # --- PWR1xx: artifacts (GGUF header, size, digest, quant, architecture) -
    # --- PWR2xx: drafters (kind, contract, binding, auto resolution) --------
    # --- PWR3xx: tokenizer identity ----------------------------------------
    # --- PWR4xx: speculation settings (K, S, FR, adaptive, flags) ----------
    # --- PWR5xx: memory -----------------------------------------------------
}


def title(code: str) -> str:
    return CODES[code][1]


def markdown_table() -> str:
    rows = ["| code | severity | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{code}` | {sev} | {text} |" for code, (sev, text) in sorted(CODES.items())]
    return "# Check codes\n\nStable codes; never renumbered. Generated from `orchestrator/codes.py`.\n\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
