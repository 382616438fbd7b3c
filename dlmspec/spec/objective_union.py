"""``[objective]``'s spec models, one per registered objective: the union discriminated on
``objective.kind`` that ``Spec.objective`` becomes once an objective registers a model of its own
(:attr:`dlmspec.objectives.Objective.spec_model`).

The built-in objectives use :class:`dlmspec.spec.models.ObjectiveSpec` (the keys every objective
has); while every registered objective does, ``Spec.objective`` is that model alone, so the JSON
Schema (``dlmspec schema``), the fast checker (:mod:`dlmspec.spec.fast`) and every message stay as
they are. A plugin's model subclasses it with keys of its own; then ``Spec.objective`` is
``Annotated[Union[...], Discriminator(_objective_tag)]``, each member tagged with the first kind
registered with it, and an error's location carries that tag (``objective.toy.toy_rate``):
:func:`plain_objective_loc` takes it out again, so users read the key they wrote
(``objective.toy_rate``).

The models are passed in (``refresh(ObjectiveSpec, Spec)``), so this module does not import
:mod:`dlmspec.spec.models` (which imports it).
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Discriminator, Tag

from dlmspec import objectives

#: ``{tag: model}`` of the ``objective`` union while a registered objective has a spec model of its
#: own (empty: ``Spec.objective`` is plain ``ObjectiveSpec``). A tag is the first kind registered
#: with its model (``ObjectiveSpec``'s: ``"ObjectiveSpec"`` if no kind uses it), the base first.
OBJECTIVE_TAGS: dict[str, type[BaseModel]] = {}


def objective_model(kind: Any, base: type[BaseModel]) -> type[BaseModel]:
    """The spec model ``[objective]`` validates against for ``kind``: the registered objective's
    ``spec_model``, else ``base`` (``ObjectiveSpec``: the built-ins, and an unregistered kind, whose
    error then names the registered ones). ``None`` (kind unset) is ``base.kind``'s default,
    ``"mdm"``."""
    if kind is None:
        kind = base.model_fields["kind"].default
    model = getattr(objectives.find(kind), "spec_model", None)
    return model if model is not None else base


def _objective_tag(value: Any) -> str:
    """The union member of ``value`` (the ``[objective]`` table as written, or a model instance):
    the model of its ``kind`` (unset: ``"mdm"``); anything else goes to the base, whose errors are
    the usual ones (unknown kind, not a table)."""
    base = next(iter(OBJECTIVE_TAGS.values()))
    tags = {model: tag for tag, model in OBJECTIVE_TAGS.items()}
    if isinstance(value, BaseModel):
        return tags.get(type(value), tags[base])
    model = objective_model(value.get("kind"), base) if isinstance(value, dict) else base
    return tags.get(model, tags[base])


def plain_objective_loc(loc: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    """An error location without the union's tag: ``("objective", "toy", "toy_rate")`` ->
    ``("objective", "toy_rate")`` (users write ``[objective] toy_rate``); others unchanged."""
    loc = tuple(loc)
    if len(loc) >= 2 and loc[0] == "objective" and loc[1] in OBJECTIVE_TAGS:
        return (loc[0], *loc[2:])
    return loc


def refresh(base: type[BaseModel], spec: type[BaseModel]) -> None:
    """Rebuild ``base.kind`` (every registered kind), each objective's own model's ``kind`` (the
    kinds registered with it) and ``spec.objective`` (``base``, or the union) from the registry.

    Raises:
        TypeError: a ``spec_model`` that does not subclass ``base`` (``spec.objective`` is then left
            half-built: :func:`dlmspec.objectives.register` undoes the registration and calls
            this again).
    """
    kinds = objectives.kinds()
    base.model_fields["kind"].annotation = Literal[kinds]
    base.model_rebuild(force=True)
    groups: dict[Any, list[str]] = {base: []}
    for kind in kinds:
        groups.setdefault(objective_model(kind, base), []).append(kind)
    OBJECTIVE_TAGS.clear()
    OBJECTIVE_TAGS[(groups[base] or [base.__name__])[0]] = base  # first: messages walk to it
    for model, its in groups.items():
        if model is base:
            continue
        if not (isinstance(model, type) and issubclass(model, base)):
            raise TypeError(f"objective {its[0]!r}: spec_model must subclass {base.__module__}.{base.__name__}, "
                            f"got {model!r}")
        field = copy.copy(base.model_fields["kind"])
        field.annotation = Literal[tuple(its)]
        field.default = its[0]
        model.model_fields["kind"] = field
        model.model_rebuild(force=True)
        OBJECTIVE_TAGS[its[0]] = model
    if len(OBJECTIVE_TAGS) > 1:
        members = tuple(Annotated[model, Tag(tag)] for tag, model in OBJECTIVE_TAGS.items())
        spec.model_fields["objective"].annotation = Annotated[Union[members], Discriminator(_objective_tag)]
    else:
        OBJECTIVE_TAGS.clear()
        spec.model_fields["objective"].annotation = base
    spec.model_rebuild(force=True)
