"""Parameters per ZeRO unit of a tide LLaMA's model.safetensors (parameter_names.h): 0 the
embeddings, 1 + i block i, "head" the final norm and the untied output head."""
import json
import struct


def unit_sizes(weights_path):
    with open(weights_path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    units = {}
    for name, e in header.items():
        if name == "__metadata__":
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
