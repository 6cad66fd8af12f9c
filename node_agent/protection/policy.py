"""The extender's policy held within the agent's flags: stricter is followed, looser is not.

Pure. Imports only ``power``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from node_agent.protection import power

_STRICTER: dict[str, tuple[Callable[[power.PowerArgs], float], Callable[[float, float], float]]] = {
    "max_temp_c": (lambda flags: flags.max_temp_c, min),
    "cool_down_s": (lambda flags: flags.cool_down_s, max),
    # Saving engages under the threshold, so a higher one saves on more GPUs; saving switched
    # off saves as little as a threshold of 0.
    "power_saving_threshold_pct": (
        lambda flags: flags.threshold_pct if flags.saving_enabled else 0.0,
        max,
    ),
}
"""Each number of the policy that bounds local protection: the flags' value it is held to, and
which of the two is stricter (a lower maxTemp, a longer cool-down, a higher saving threshold)."""


def within_flags(
    policy: Mapping[str, float | bool], flags: power.PowerArgs, *, accept_looser: bool = False
) -> tuple[dict[str, float | bool], tuple[str, ...]]:
    """The policy local protection follows, and the fields of ``policy`` looser than ``flags``.

    An extender may make the agent's protection stricter than its own settings, never looser:
    a looser field is held at the flag's value (power saving stays on where the flags turn it
    on) and named, unless ``accept_looser``. ``memory_block_mib`` is no protection: it passes.
    """
    out = dict(policy)
    if accept_looser:
        return out, ()
    looser = []
    for key, (flag_value, stricter) in _STRICTER.items():
        if key in policy:
            value, flag = float(policy[key]), float(flag_value(flags))
            out[key] = stricter(value, flag)
            if out[key] != value:
                looser.append(key)
    if policy.get("power_saving") is False and flags.saving_enabled:
        out["power_saving"] = True
        looser.append("power_saving")
    return out, tuple(looser)
