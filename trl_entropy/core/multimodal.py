"""The multimodal inputs of a vision-language model's forward, as ``trl.GRPOTrainer`` carries them with a batch, and
the checks that keep a VLM from training on misplaced images.

TRL's generation batch holds the processor's image tensors beside the token ids. Some are per row
(``token_type_ids``, ``mm_token_type_ids``; Idefics3's ``pixel_values`` and ``pixel_attention_mask``, padded per row to
the most images), some per image (``image_grid_thw``, ``image_sizes``, ``image_position_ids``; ``pixel_values`` with
one entry per image), some per patch (Qwen-VL's ``pixel_values``: ``image_grid_thw.prod()`` rows per image) or per
tile (InternVL and LFM2-VL, counted by ``num_tiles`` per row). ``num_images`` (per row, 0 for a prompt without an
image) and ``num_tiles`` place them; the model does not take those two. :func:`rows_of` cuts the inputs of a slice of
rows, as TRL's scoring cuts them when it scores a generation batch ``batch_size`` rows at a time; a slice of rows
without an image gets no image inputs (TRL gives it empty ones, which a vision tower fails on).
"""

# What the model's forward takes, and what only places the others in the batch.
MODEL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "spatial_shapes",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
PLACEMENT_KEYS = ("num_images", "num_tiles")
PER_ROW_KEYS = ("token_type_ids", "mm_token_type_ids")
KNOWN_KEYS = (*MODEL_KEYS, *PLACEMENT_KEYS)


def multimodal_inputs(inputs: dict) -> dict:
    """The multimodal entries of a batch (those that are set)."""
    return {key: inputs[key] for key in KNOWN_KEYS if inputs.get(key) is not None}


def check_known_inputs(model_inputs: dict) -> None:
    """Refuse a multimodal input this module does not place (a later TRL's): scoring without it would score another
    model than TRL's."""
    unknown = sorted(key for key, value in model_inputs.items() if value is not None and key not in KNOWN_KEYS)
    if unknown:
        raise NotImplementedError(
            f"trl_entropy does not pass the model inputs {unknown} that this TRL scores with: add them to "
            "trl_entropy/core/multimodal.py (where each slice of rows gets its own), or use a supported TRL version."
        )


def bounds(counts, start: int, end: int) -> tuple[int, int]:
    """Where rows ``start:end`` begin and end along a dimension holding ``counts[row]`` entries per row."""
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + int(count))
    return offsets[start], offsets[end]


def rows_of(multimodal: dict, start: int, end: int) -> dict:
    """The model inputs of rows ``start:end`` of a batch whose multimodal entries are ``multimodal``."""
    sliced = {key: multimodal[key][start:end] for key in PER_ROW_KEYS if key in multimodal}
    images_per_row, pixel_values = multimodal.get("num_images"), multimodal.get("pixel_values")
    if images_per_row is None:  # no placement: every image tensor is per row
        for key in ("pixel_values", "pixel_attention_mask", "image_sizes"):
            if key in multimodal:
                sliced[key] = multimodal[key][start:end]
        return sliced
    first_image, last_image = bounds(images_per_row, start, end)
    if first_image == last_image or pixel_values is None:  # a vision tower fails on an empty batch of images
        return sliced
    for key in ("image_grid_thw", "image_sizes", "image_position_ids"):
        if key in multimodal:
            sliced[key] = multimodal[key][first_image:last_image]
    if "num_tiles" in multimodal:
        first_tile, last_tile = bounds(multimodal["num_tiles"], start, end)
        for key in ("pixel_values", "pixel_attention_mask", "spatial_shapes"):
            if key in multimodal:
                sliced[key] = multimodal[key][first_tile:last_tile]
    elif "pixel_attention_mask" in multimodal:  # Idefics3 / SmolVLM: both padded per row to the most images
        sliced["pixel_attention_mask"] = multimodal["pixel_attention_mask"][start:end]
        sliced["pixel_values"] = pixel_values[start:end]
    elif "image_grid_thw" in multimodal:  # Qwen-VL: the patches of every image, one after the other
        patches_per_image = multimodal["image_grid_thw"].prod(dim=-1).tolist()
        patches_per_row = [sum(group) for group in split(patches_per_image, images_per_row)]
        first_patch, last_patch = bounds(patches_per_row, start, end)
        sliced["pixel_values"] = pixel_values[first_patch:last_patch]
    elif pixel_values.size(0) == sum(images_per_row):  # one entry per image (Gemma 3, LLaVA)
        sliced["pixel_values"] = pixel_values[first_image:last_image]
    else:
        sliced["pixel_values"] = pixel_values[start:end]
    return sliced


def split(values: list, counts: list[int]) -> list[list]:
    """``values`` cut into consecutive groups of ``counts`` entries."""
    groups, offset = [], 0
    for count in counts:
        groups.append(values[offset : offset + count])
        offset += count
    return groups


def image_token_id(config) -> int | None:
    """The id of the placeholder token a vision-language model (of ``config``) replaces with image features (None: no
    such token)."""
    for attribute in ("image_token_id", "image_token_index"):
        value = getattr(config, attribute, None)
        if value is not None:
            return int(value)
    return None


def check_image_tokens(model, input_ids, attention_mask, logits_to_keep: int, has_images: bool) -> None:
    """Refuse a batch whose image placeholders the model would fill wrongly: one in a completion (the policy sampled
    it), or in a prompt of a batch without images (the token's own embedding would stand in for an image)."""
    token = image_token_id(model.config)
    if token is None:
        return
    placeholders = (input_ids == token) & attention_mask.bool()
    in_completions = int(placeholders[:, -logits_to_keep:].sum())
    name = type(model).__name__
    if in_completions:
        raise ValueError(
            f"{in_completions} completion token(s) of this batch are {name}'s image placeholder (token id {token}): "
            "the policy sampled it, and the forward would look for an image to put there. Keep generation from "
            f"sampling it: GRPOConfig(generation_kwargs={{'suppress_tokens': [{token}]}})."
        )
    if not has_images and bool(placeholders.any()):
        raise ValueError(
            f"The prompts of this batch hold {int(placeholders.sum())} image placeholder token(s) of {name} (token "
            f"id {token}) but the batch has no images. Give the dataset an 'image' (or 'images') column with "
            "conversational prompts, and let the processor insert the placeholders; do not write them into the "
            "prompt text."
        )


def explained_mismatch(model, error: ValueError) -> ValueError | None:
    """The model's own error for image placeholders that do not match the image features, with the class and the
    fix; None for any other error."""
    if "image tokens do not match" not in str(error):
        return None
    return ValueError(
        f"{type(model).__name__}: {error}. The prompts hold a different number of image placeholders than the images "
        "give features: pass the images through the dataset's 'image' or 'images' column (one entry per image part "
        "of the prompt) and do not truncate the prompt (the placeholders must stay whole)."
    )
