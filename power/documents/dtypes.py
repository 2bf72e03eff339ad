"""The weight dtypes the runtime can pack matrices in (`power.runtime.linear`), importable without torch.

The CLI offers these as choices; `linear.KINDS` implements one packing per name.
"""

WEIGHT_DTYPES = ("float32", "bfloat16", "int8")
