"""A strict check of a JSON value against an SDK's request parameter types (TypedDicts,
unions, literals, iterables): every key known, every required key present, every value of its
declared type, at every depth. pydantic's TypeAdapter leaves `Iterable[...]` fields lazy (and
its lazy validator fails on the anthropic SDK's recursive block types), and ignores unknown
keys; this walks the types itself."""

import collections.abc
import typing

import typing_extensions


def _is_typeddict(t) -> bool:
    return typing_extensions.is_typeddict(t)


def _required(td, hint) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing_extensions.Required:
        return True
    if origin is typing_extensions.NotRequired:
        return False
    return bool(getattr(td, "__total__", True))


def check(value, annotation, path: str = "$") -> None:
    """Raises AssertionError naming the first place `value` does not fit `annotation`."""
    problem = _problem(value, annotation, path)
    assert problem is None, problem


def _problem(value, t, path):  # noqa: C901 - one branch a kind of type
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if t is typing.Any or t is object:
        return None
    if origin in (typing.Annotated, typing_extensions.Annotated):
        return _problem(value, args[0], path)
    if origin in (typing_extensions.Required, typing_extensions.NotRequired, typing_extensions.ReadOnly):
        return _problem(value, args[0], path)
    if origin is typing.Union or (hasattr(__import__("types"), "UnionType")
                                  and origin is __import__("types").UnionType):
        problems = [_problem(value, a, path) for a in args]
        if any(p is None for p in problems):
            return None
        return f"{path}: fits none of {t}: " + "; ".join(problems[:4])
    if origin in (typing.Literal, typing_extensions.Literal):
        return None if value in args else f"{path}: {value!r} is not one of {args}"
    if t is type(None):
        return None if value is None else f"{path}: expected null"
    if _is_typeddict(t):
        if not isinstance(value, dict):
            return f"{path}: expected an object for {t.__name__}"
        hints = typing_extensions.get_type_hints(t, include_extras=True)
        unknown = set(value) - set(hints)
        if unknown:
            return f"{path}: {t.__name__} has no {sorted(unknown)}"
        missing = {k for k, h in hints.items() if _required(t, h)} - set(value)
        if missing:
            return f"{path}: {t.__name__} needs {sorted(missing)}"
        for k, v in value.items():
            p = _problem(v, hints[k], f"{path}.{k}")
            if p:
                return p
        return None
    if origin in (dict, collections.abc.Mapping, typing.Dict):
        return None if isinstance(value, dict) else f"{path}: expected an object"
    if origin in (list, tuple, collections.abc.Iterable, collections.abc.Sequence,
                  typing.List, typing.Iterable, typing.Sequence):
        if not isinstance(value, list):
            return f"{path}: expected an array"
        for i, v in enumerate(value):
            p = _problem(v, args[0] if args else typing.Any, f"{path}[{i}]")
            if p:
                return p
        return None
    if t is str:
        return None if isinstance(value, str) else f"{path}: expected a string"
    if t is bool:
        return None if isinstance(value, bool) else f"{path}: expected a boolean"
    if t is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"{path}: expected an integer"
    if t is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"{path}: expected a number"
    if isinstance(t, typing.TypeVar):
        return None
    if isinstance(t, type) and hasattr(t, "model_fields"):
        # A response model the SDK also takes back as a parameter (a content block).
        if not isinstance(value, dict):
            return f"{path}: expected an object for {t.__name__}"
        fields = {f.alias or name for name, f in t.model_fields.items()}
        unknown = set(value) - fields
        if unknown:
            return f"{path}: {t.__name__} has no {sorted(unknown)}"
        try:
            t.model_validate(value)
        except Exception as e:  # pydantic's ValidationError
            return f"{path}: not a {t.__name__}: {str(e)[:200]}"
        return None
    # Anything else (dates, files): not part of a JSON request body.
    return None
