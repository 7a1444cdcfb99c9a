"""Policies: named rule sets compiled per stage, chosen per tenant.

:class:`PolicyBook` is built once at startup from :class:`SafetyFilterSettings`; every
regular expression is compiled (and checked) then, never per request.
"""

from __future__ import annotations

from collections import Counter as _Tally
from dataclasses import dataclass
from typing import Literal

from servehall import FilterVerdict, Principal
from servehall_safety_filter.matcher import CompiledRule, StageRules, compile_rule
from servehall_safety_filter.settings import SafetyFilterSettings

Stage = Literal["input", "output"]


@dataclass(slots=True)
class Policy:
    """One named rule set, compiled for both stages."""

    name: str
    monitor: bool
    input: StageRules
    output: StageRules


class PolicyBook:
    """Every policy of a deployment and the tenant → policy map.

    Raises:
        ValueError: a rule cannot be compiled (bad regex, unknown detector).
    """

    def __init__(self, cfg: SafetyFilterSettings) -> None:
        self.settings = cfg
        by_name = {r.name: r for r in cfg.rules}
        self.policies: dict[str, Policy] = {}
        for pname, ps in cfg.effective_policies().items():
            monitor = ps.mode == "monitor"
            compiled = [compile_rule(by_name[r], monitor, cfg) for r in ps.rules]
            self.policies[pname] = Policy(
                pname,
                monitor,
                StageRules.build(
                    [
                        c
                        for c, r in zip(compiled, ps.rules, strict=True)
                        if "input" in by_name[r].stages
                    ]
                ),
                StageRules.build(
                    [
                        c
                        for c, r in zip(compiled, ps.rules, strict=True)
                        if "output" in by_name[r].stages
                    ]
                ),
            )
        self.default = self.policies[cfg.default_policy]
        self.tenants = {t: self.policies[p] for t, p in cfg.tenant_policies.items()}

    def for_principal(self, principal: Principal | None) -> Policy:
        """The policy of the principal's tenant, else the default policy."""
        tenant = principal.tenant if principal is not None else None
        if tenant is None:
            return self.default
        return self.tenants.get(tenant, self.default)

    @property
    def has_input_rules(self) -> bool:
        """True when some policy filters prompts."""
        return any(p.input for p in self.policies.values())

    @property
    def has_output_rules(self) -> bool:
        """True when some policy filters generated text."""
        return any(p.output for p in self.policies.values())


def tally_verdicts(tally: _Tally[tuple[str, str, bool]], stage: Stage) -> tuple[FilterVerdict, ...]:
    """Turn ``{(rule, action, monitor): count}`` into verdicts (no matched text)."""
    return tuple(
        FilterVerdict(action, rule, stage, n, monitor)  # type: ignore[arg-type]
        for (rule, action, monitor), n in tally.items()
    )


def tally_key(rule: CompiledRule) -> tuple[str, str, bool]:
    """Tally key of one hit of ``rule``."""
    return (rule.name, rule.action, rule.monitor)
