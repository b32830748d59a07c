"""Images we decode ourselves (to downscale one for a model, to make a thumbnail), under a
cap on the pixels decoded: AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS.

A PNG of a few KB can say it is 13,000 × 13,000 pixels, and decoding it takes a byte a
pixel at the least (four for RGBA): hundreds of MB in a worker or the web process, from
anyone who can send a photo. Pillow's own guard refuses only past ~179 Mpx. So the
header is read (Pillow's `open` reads nothing more) and its size judged before any
pixel is: a JPEG first set to decode at the smallest of its 1/2, 1/4 or 1/8 scales that
still covers what we need (`draft`), so a phone's full-size photo costs what it will be
shown at; anything still over the cap is not decoded (`TooManyPixels`, saying why).
Pillow's MAX_IMAGE_PIXELS is set to the cap too: a backstop for any other code of the
process that opens an image (Pillow refuses past twice it, at open)."""

import functools
import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:
    from PIL.Image import Image as PillowImage


class TooManyPixels(ValueError):
    """The image would take more pixels to decode than AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS."""

    def __init__(self, size: tuple[int, int] | None, cap: int):
        # Past twice the cap Pillow refuses at open, before we see the size (its backstop).
        what = f"{size[0]} × {size[1]} pixels" if size else f"more than {2 * cap / 1_000_000:g} Mpx"
        super().__init__(f"it is {what}, over the {cap / 1_000_000:g} Mpx an image may have to be decoded "
                         "(AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS)")
        self.size = size


@functools.cache
def _pillow() -> Any:  # the module PIL.Image (a module is no type of its own)
    """Pillow, imported where an image is decoded (not by every process at its start)."""
    from PIL import Image

    # Pillow warns of a "decompression bomb" between its MAX_IMAGE_PIXELS and twice it; here
    # every size is judged (`opened`), so the warning would only say it again. Set once for the
    # process: warnings.catch_warnings() around each open is not thread-safe (the web process).
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return Image


def pixel_cap() -> int:
    cap: int = settings.AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS
    _pillow().MAX_IMAGE_PIXELS = cap  # the backstop (see above); one value per process, the setting's
    return cap


@contextmanager
def opened(data: bytes, fit: int) -> Iterator["PillowImage"]:
    """The image in `data`, its header read and nothing decoded yet, to be shown at most
    `fit` pixels a side: TooManyPixels when decoding it would take more than the cap;
    OSError or ValueError when Pillow cannot read it."""
    Image, cap = _pillow(), pixel_cap()
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise TooManyPixels(None, cap) from None
    with image:
        if image.format == "JPEG":
            image.draft(None, (fit, fit))  # decodes at a reduced scale, no smaller than fit × fit
        width, height = image.size
        if width * height > cap:
            raise TooManyPixels((width, height), cap)
        try:
            yield image
        except Image.DecompressionBombError:  # a format that learns its size only as it decodes
            raise TooManyPixels(None, cap) from None


def as_jpeg(image: "PillowImage", side: int, quality: int) -> bytes:
    """The opened image at most `side` pixels a side, as JPEG bytes."""
    image.thumbnail((side, side))
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=quality)
    return out.getvalue()
