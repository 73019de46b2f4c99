"""PyTorch's bf16 autocast on the check `gpu smoke` (sluice-infer's device-check test) makes of Sluice's: the reference for its tolerance.

Usage: python3 amp_torch.py OUT.json   (needs the carried Ultralytics wheel on PYTHONPATH for the YOLOv8n model)
Ultralytics' YOLOv8n (random init, train mode, as Sluice's seeded model) on a batch of 2 uniform-noise images at
320: the raw head outputs (boxes and scores) and the first convolution's weight gradient of their sum, in f32 and
under torch.autocast(bfloat16), compared as Sluice compares its own: the outputs by the largest difference over the
largest f32 value, the gradient by that and by its direction (1 - cosine). Three seeds. f32 convolutions keep
PyTorch's default (cuDNN may use TF32), as Sluice's cuDNN default math does.
"""
import json
import sys

out = sys.argv[1]
result = {"seeds": []}
try:
    import torch
    from ultralytics.nn.tasks import DetectionModel

    for seed in range(3):
        torch.manual_seed(seed)
        m = DetectionModel("yolov8n.yaml", nc=80, verbose=False).cuda().train()
        x = torch.rand(2, 3, 320, 320, device="cuda")

        def run(amp):
            m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                p = m(x)
                o = torch.cat([p["boxes"], p["scores"]], 1)
            o.float().sum().backward()
            return o.float().detach(), m.model[0].conv.weight.grad.detach().float().clone()

        (fo, fg), (ho, hg) = run(False), run(True)
        cos = torch.nn.functional.cosine_similarity(fg.flatten().double(), hg.flatten().double(), dim=0).item()
        entry = {
            "seed": seed,
            "outputs_rel": ((ho - fo).abs().max() / fo.abs().max()).item(),
            "grad_rel": ((hg - fg).abs().max() / fg.abs().max()).item(),
            "grad_1_minus_cos": 1.0 - cos,
        }
        result["seeds"].append(entry)
        print(json.dumps(entry), flush=True)
    result["torch"] = torch.__version__
except Exception as e:  # noqa: BLE001
    result["error"] = repr(e)
    print(result["error"])
json.dump(result, open(out, "w"), indent=1)
