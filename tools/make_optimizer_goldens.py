#!/usr/bin/python3
"""Optimizer goldens: three AdamW steps (torch.optim.AdamW) and three LAMB steps (reference
below, per You et al. 2019) on a tiny BERT's parameters, with biases and LayerNorm parameters
excluded from weight decay (and from LAMB's trust ratio).

    /usr/bin/python3 tools/make_optimizer_goldens.py tests/golden/optimizers.safetensors
"""
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from make_model_golden import BertForPreTraining, config, save_safetensors  # noqa: E402

LRS = [1e-2, 5e-3, 2e-3]
BETAS, EPS, WD = (0.9, 0.999), 1e-6, 0.01


def no_decay(name):
    return "LayerNorm" in name or name.endswith("bias")


def lamb_step(params, grads, state, lr, t):
    b1, b2 = BETAS
    for name, p in params.items():
        g = grads[name]
        m, v = state.setdefault(name, (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + EPS)
        wd = 0.0 if no_decay(name) else WD
        u = u + wd * p
        pn, un = p.norm(), u.norm()
        trust = 1.0 if (no_decay(name) or pn == 0 or un == 0) else float(pn / un)
        p.sub_(lr * trust * u)


def main(out):
    cfg = config(11, 8, 1, 2, 12, 6)
    cfg["num_labels"] = 2
    torch.manual_seed(5)
    model = BertForPreTraining(cfg)
    params0 = {n: (0.1 * torch.randn_like(p)).detach() for n, p in model.named_parameters()}
    grads = [{n: torch.randn_like(p) for n, p in params0.items()} for _ in LRS]
    tensors = {f"params.{n}": p for n, p in params0.items()}
    for t, g in enumerate(grads):
        tensors.update({f"grad.{t}.{n}": x for n, x in g.items()})
    # AdamW through torch.optim, with a no-decay group.
    adam_params = {n: p.clone().requires_grad_() for n, p in params0.items()}
    groups = [{"params": [p for n, p in adam_params.items() if not no_decay(n)], "weight_decay": WD},
              {"params": [p for n, p in adam_params.items() if no_decay(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LRS[0], betas=BETAS, eps=EPS)
    lamb_params = {n: p.clone() for n, p in params0.items()}
    state = {}
    for t, (lr, g) in enumerate(zip(LRS, grads)):
        for group in opt.param_groups:
            group["lr"] = lr
        for n, p in adam_params.items():
            p.grad = g[n].clone()
        opt.step()
        lamb_step(lamb_params, g, state, lr, t + 1)
        tensors.update({f"adamw.{t}.{n}": p.detach().clone() for n, p in adam_params.items()})
        tensors.update({f"lamb.{t}.{n}": p.clone() for n, p in lamb_params.items()})
    save_safetensors(out, tensors, {"config": json.dumps(cfg), "lrs": json.dumps(LRS),
                                    "betas": json.dumps(BETAS), "eps": str(EPS), "weight_decay": str(WD)})
    print(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/optimizers.safetensors")
