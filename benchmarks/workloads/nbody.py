"""The n-body kernel's shape: a small pairwise step called from a loop over pairs.

``nb_advance`` walks every pair of five bodies and calls ``nb_pair`` (a handful of
float operations) for each, then ``nb_move`` per body; ``nb_energy`` is computed
now and then.  Straight-line arithmetic between calls is what a GIL-taking collector
under-samples (DESIGN.md: such functions got a quarter of their time).  No part is
timed: the workload is judged against py-spy at 1000 Hz, beside py-spy's own TVD
at the row's rate (py-spy-200's for 5 ms, py-spy-1000's run to run for 1 ms).
"""

from __future__ import annotations

from typing import Any

from . import seconds_per_unit

NAME = "nbody"
DESCRIPTION = "n-body shaped: nb_pair (a few float ops) called per pair from nb_advance"
PARTS: tuple = ()
SINGLE_THREAD = True
STEPS_PER_ENERGY = 200


def _bodies() -> list:
    pi = 3.14159265358979323
    mass = 4 * pi * pi
    days = 365.24
    return [[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], mass],
            [[4.84, -1.16, -0.10], [0.00166 * days, 0.00770 * days, -0.0000690 * days], 0.000954 * mass],
            [[8.34, 4.12, -0.40], [-0.00277 * days, 0.00500 * days, 0.0000230 * days], 0.000286 * mass],
            [[12.89, -15.11, -0.22], [0.00297 * days, 0.00238 * days, -0.0000297 * days], 0.0000437 * mass],
            [[15.38, -25.92, 0.18], [0.00268 * days, 0.00163 * days, -0.0000952 * days], 0.0000515 * mass]]


def nb_pair(b1: list, b2: list, dt: float) -> None:
    (x1, y1, z1), v1, m1 = b1
    (x2, y2, z2), v2, m2 = b2
    dx, dy, dz = x1 - x2, y1 - y2, z1 - z2
    mag = dt * ((dx * dx + dy * dy + dz * dz) ** -1.5)
    b1m, b2m = m1 * mag, m2 * mag
    v1[0] -= dx * b2m
    v1[1] -= dy * b2m
    v1[2] -= dz * b2m
    v2[0] += dx * b1m
    v2[1] += dy * b1m
    v2[2] += dz * b1m


def nb_move(body: list, dt: float) -> None:
    r, (vx, vy, vz), _ = body
    r[0] += dt * vx
    r[1] += dt * vy
    r[2] += dt * vz


def nb_advance(bodies: list, pairs: list, dt: float, steps: int) -> None:
    for _ in range(steps):
        for b1, b2 in pairs:
            nb_pair(b1, b2, dt)
        for body in bodies:
            nb_move(body, dt)


def nb_energy(bodies: list, pairs: list) -> float:
    e = 0.0
    for b1, b2 in pairs:
        (x1, y1, z1), _, m1 = b1
        (x2, y2, z2), _, m2 = b2
        e -= (m1 * m2) / (((x1 - x2) ** 2 + (y1 - y2) ** 2 + (z1 - z2) ** 2) ** 0.5)
    for (_, (vx, vy, vz), m) in bodies:
        e += m * (vx * vx + vy * vy + vz * vz) / 2.0
    return e


def nb_main(rounds: int) -> float:
    bodies = _bodies()
    pairs = []
    for i in range(len(bodies)):
        for j in range(i + 1, len(bodies)):
            pairs.append((bodies[i], bodies[j]))
    e = 0.0
    for _ in range(rounds):
        nb_advance(bodies, pairs, 0.01, STEPS_PER_ENERGY)
        e = nb_energy(bodies, pairs)
    return e


def calibrate(seconds: float) -> dict:
    per_round = seconds_per_unit(nb_main, 20)
    return {"rounds": max(1, round(seconds / per_round))}


def setup(params: dict) -> Any:
    return params


def run(state: Any) -> dict:
    nb_main(state["rounds"])
    return {}
