"""Parameters per ZeRO unit of a tide LLaMA's model.safetensors (parameter_names.h): 0 the
embeddings, 1 + i block i, "head" the final norm and the untied output head."""
import json
import struct


def widened(name, shape):
    """Whether ZeRO-3 gathered in bf16 widens the parameter to fp32 (LLaMA, no tensor
    parallelism: transformer.h, weights_read_in_compute_dtype): all but the projections'
    and the untied head's matrices."""
    return len(shape) == 1 or "embed_tokens" in name


def unit_sizes(weights_path, only=lambda name, shape: True):
    """Elements per unit, of the parameters `only(name, shape)` accepts."""
    with open(weights_path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    units = {}
    for name, e in header.items():
        if name == "__metadata__" or not only(name, e["shape"]):
            continue
        n = 1
        for d in e["shape"]:
            n *= d
        if ".layers." in name:
            unit = 1 + int(name.split(".layers.")[1].split(".")[0])
        else:
            unit = "head" if name in ("lm_head.weight", "model.norm.weight") else 0
        units[unit] = units.get(unit, 0) + n
    return units
