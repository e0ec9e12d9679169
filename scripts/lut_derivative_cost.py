"""What a PINN step costs, and how accurate its derivatives are, with a LUT-mode polynomial KAN against the same
network in exact mode: a 2-32-32-1 ChebyKANLinear network (degree 8, float32) on the 1-D heat residual
u_t - 0.1 u_xx at 4096 collocation points, the derivatives by ``torch.autograd.grad(create_graph=True)`` or by
Taylor mode (``warpkan.torch_bridge.jet``), then ``loss.backward()`` and an Adam step; the first-order step (a
loss of u alone) alongside.

    python scripts/lut_derivative_cost.py              # CPU, one torch thread
    python scripts/lut_derivative_cost.py --device cuda

Prints two markdown tables: ms per step (the fastest of --rounds x --repeats timed blocks of --steps steps, the
modes interleaved; on the CPU the process's CPU time on one torch thread, ``time.process_time``, which other
processes' load does not inflate), and the largest error of u, u_x, u_t and u_xx against the float64 pure-torch
network of the same parameters (``warpkan.reference.poly``), relative to the largest magnitude of each.
"""

from __future__ import annotations

import argparse
import time

import torch

from warpkan.reference import poly as ref_poly
from warpkan.torch_bridge import ChebyKANLinear, jet

WIDTHS, DEGREE, NU = (2, 32, 32, 1), 8, 0.1


def network(mode: str, device: str) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[ChebyKANLinear(a, b, DEGREE, mode=mode, device=device)
                                 for a, b in zip(WIDTHS[:-1], WIDTHS[1:])])


def reference(model: torch.nn.Sequential, z: torch.Tensor) -> torch.Tensor:
    """The same network in float64 pure torch."""
    for layer in model:
        z = ref_poly.poly_kan(z, layer.coeffs.detach().double().permute(0, 2, 1), None, "chebyshev")
    return z


def autograd_derivatives(model, xt):
    """(u, u_x, u_t, u_xx) by create_graph=True."""
    xt = xt.detach().requires_grad_()
    u = model(xt)
    (du,) = torch.autograd.grad(u.sum(), xt, create_graph=True)
    (d2u,) = torch.autograd.grad(du[:, 0].sum(), xt, create_graph=True)
    return u[:, 0], du[:, 0], du[:, 1], d2u[:, 0]


def taylor_derivatives(model, xt):
    """(u, u_x, u_t, u_xx) by Taylor mode."""
    u = jet(model, xt.detach(), pairs=((0, 0),))
    return u.value[:, 0], u.d(0)[:, 0], u.d(1)[:, 0], u.d2(0, 0)[:, 0]


ROUTES = {"create_graph": autograd_derivatives, "jet": taylor_derivatives}


class Stepper:
    def __init__(self, model, xt, route):
        self.model, self.xt, self.route = model, xt, route
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def __call__(self):
        self.optimizer.zero_grad()
        if self.route is None:  # first order
            loss = self.model(self.xt).square().mean()
        else:
            u, u_x, u_t, u_xx = ROUTES[self.route](self.model, self.xt)
            loss = (u_t - NU * u_xx).square().mean()
        loss.backward()
        self.optimizer.step()


def block_ms(step, device: str, steps: int) -> float:
    clock = time.perf_counter if device == "cuda" else time.process_time
    if device == "cuda":
        torch.cuda.synchronize()
    start = clock()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (clock() - start) * 1e3 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--points", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the two modes")
    args = parser.parse_args()
    device = args.device
    if device == "cpu":
        torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    xt = (torch.rand(args.points, 2, generator=gen) * 2 - 1).to(device)
    modes = ("lut", "exact")
    print(f"device {device}, torch {torch.__version__}; {'-'.join(map(str, WIDTHS))} ChebyKANLinear degree {DEGREE}, "
          f"{args.points} points; fastest of {args.rounds} x {args.repeats} blocks of {args.steps} steps")

    print("\n| step | mode='lut' ms/step | mode='exact' ms/step | lut / exact |")
    print("|---|---|---|---|")
    for route in (None, "create_graph", "jet"):
        steppers = {}
        for mode in modes:
            steppers[mode] = Stepper(network(mode, device), xt, route)
            for _ in range(args.warmup):
                steppers[mode]()
        best = dict.fromkeys(modes, float("inf"))
        for _ in range(args.rounds):
            for mode in modes:
                for _ in range(args.repeats):
                    best[mode] = min(best[mode], block_ms(steppers[mode], device, args.steps))
        label = "first order (loss of u)" if route is None else f"heat residual by {route}"
        print(f"| {label} | {best['lut']:.2f} | {best['exact']:.2f} | {best['lut'] / best['exact']:.2f} |", flush=True)

    print("\n| route | mode | u | u_x | u_t | u_xx |  (largest error / largest magnitude, against float64)")
    print("|---|---|---|---|---|---|")
    x64 = xt.double().requires_grad_()
    for route in ROUTES:
        for mode in modes:
            model = network(mode, device)
            expected = autograd_derivatives(lambda z: reference(model, z), x64)
            got = ROUTES[route](model, xt)
            errors = [float((g.detach().double() - e.detach()).abs().max() / e.detach().abs().max())
                      for g, e in zip(got, expected)]
            print(f"| {route} | {mode} | " + " | ".join(f"{err:.1e}" for err in errors) + " |", flush=True)


if __name__ == "__main__":
    main()
