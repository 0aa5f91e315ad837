"""One engine step's attention layout, shared by the step's attention layers.

Every attention layer of a step sees the same requests, so the step's decode/prefill split (and
its page ids) is computed once, from whichever object carries the layout (vLLM's common metadata,
SGLang's ForwardBatch), and the calls built from it are shared by the layers of one shape. The
layout source is held itself, not its id, so a later step's object can never be mistaken for it
at a recycled address.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from fi_profile.capture.kernel_call import KernelCall
from fi_profile.capture.paged_layout import PagedBatch
from fi_profile.families.attention import layer_calls

Batches = tuple[Optional[PagedBatch], Optional[PagedBatch]]


class StepAttention:
    def __init__(self) -> None:
        self.begin()

    def begin(self, **context: Any) -> None:
        """A new step; ``context``: what the engine's hooks need later in the step (its runner, metadata)."""
        self.context = context
        self._source: Any = None
        self._layout: Optional[Callable[[Any], Batches]] = None
        self._batches: Batches = (None, None)
        self._calls: dict[tuple, list[KernelCall]] = {}

    def batches(self, source: Any, layout: Callable[[Any], Batches]) -> Batches:
        """The (decode, prefill) layouts of ``source``, computed by ``layout`` once per source (and
        again where a layer asks for another split of the same source)."""
        if self._source is not source or self._layout is not layout:
            self._batches = layout(source)
            self._source, self._layout = source, layout
            self._calls = {}
        return self._batches

    def calls(self, shape: tuple, make: Callable[..., list[KernelCall]] = layer_calls) -> list[KernelCall]:
        """The step's attention calls for layers of ``shape`` (heads, head dim, page size, pages,
        dtype, scale), made by ``make`` (the family's ``layer_calls``) from the step's decode and
        prefill layouts: built once per step and shape."""
        key = (make, shape)
        calls = self._calls.get(key)
        if calls is None:
            calls = self._calls[key] = make(*self._batches, *shape)
        return calls
