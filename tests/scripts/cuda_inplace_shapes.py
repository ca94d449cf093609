"""In-place ops that change a tensor's shape, strides, offset or storage, on the simulated GPU and on the host.

For each op, the same steps on a cuda tensor and a CPU one; writes to argv[1], per op, whether the two agree in
shape, strides, offset and values (values in real mode only; a resize's new elements are left out), and the
cuda tensor's shape.
"""

import json
import sys

import torch


def steps(device: str) -> dict[str, torch.Tensor]:
    def fresh() -> torch.Tensor:
        return torch.arange(12.0, device=device).reshape(3, 4)

    src = torch.arange(6.0, device=device)
    return {
        "set_": fresh().set_(src),
        "set_storage": fresh().set_(src.untyped_storage(), 0, (2, 3), (3, 1)),
        "set_empty": fresh().set_(),
        "resize_": fresh().resize_(2, 2),
        "resize_as_": fresh().resize_as_(src),
        "as_strided_": fresh().as_strided_((2, 2), (1, 2), 1),
        "unsqueeze_": fresh().unsqueeze_(0),
        "squeeze_": fresh().unsqueeze_(0).squeeze_(0),
        "t_": fresh().t_(),
        "transpose_": fresh().transpose_(0, 1),
    }


real = len(sys.argv) > 2 and sys.argv[2] == "real"
host, gpu = steps("cpu"), steps("cuda")
out = {}
for name, expected in host.items():
    got = gpu[name]
    same = (got.shape, got.stride(), got.storage_offset()) == (
        expected.shape,
        expected.stride(),
        expected.storage_offset(),
    )
    if real:
        same = same and torch.equal(got.cpu(), expected)
    out[name] = {"same": same, "shape": list(got.shape)}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
