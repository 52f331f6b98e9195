"""Tiny vision-language models of the families ``trl.GRPOTrainer`` trains, built offline: random weights from a config
(the architecture classes of TRL's tiny test models, at similar tiny sizes), a character-level tokenizer holding the
family's image and chat tokens, the family's processor with a default-constructed image processor, and a chat template
that renders an image part as the family's image token. Images are 28 × 28 pixels: two 14-pixel patches a side.

Also the image-question dataset in TRL's shapes (an ``image`` column, the prompt as conversational messages) and a
GRPO micro-batch of a real processor's output, built by construction (no sampled token decides anything)."""

import string

import numpy
import torch
from PIL import Image


IMAGE_SIDE = 28  # pixels; the vision towers below use 14-pixel patches
TEXT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=14)
HEAD_SCALE = 40.0
CHARACTERS = string.ascii_letters + string.digits + string.punctuation + " \n"


def character_tokenizer(special_tokens: list[str], pad: str, eos: str, extra_special_tokens: dict | None = None):
    """A character-level fast tokenizer whose ``special_tokens`` are single tokens (ids 0, 1, ... in order)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(["<unk>", *special_tokens, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special_tokens])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token=pad,
        eos_token=eos,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        extra_special_tokens=extra_special_tokens or {},
    )


def chat_template(image: str, end_of_turn: str) -> str:
    """``role: content<end_of_turn>`` per message; an image part renders as ``image``, a text part as its text."""
    return (
        "{% for message in messages %}{{ message['role'] }}: "
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + image + "{% else %}"
        "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}" + end_of_turn + "{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )


def image_only(processor_class):
    """``processor_class`` (Qwen-VL's) without its video processor, which transformers builds only with torchvision."""
    from transformers import ProcessorMixin

    class ImageOnlyProcessor(processor_class):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    ImageOnlyProcessor.__name__ = ImageOnlyProcessor.__qualname__ = f"ImageOnly{processor_class.__name__}"
    return ImageOnlyProcessor


def qwen_vl(version: str):
    """Qwen2-VL (``"2"``) or Qwen2.5-VL (``"2.5"``): one 2 × 2-patch image gives one merged image token."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    specials = ["<|endoftext|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer = character_tokenizer(specials, pad="<|endoftext|>", eos="<|im_end|>")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in specials}
    text = dict(TEXT, vocab_size=len(tokenizer), rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]})
    if version == "2":
        vision = dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, mlp_ratio=2)
        config_class, model_class, processor_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    else:
        vision = dict(depth=1, hidden_size=16, out_hidden_size=16, intermediate_size=32, num_heads=2)
        vision["fullatt_block_indexes"] = [0]
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        processor_class = Qwen2_5_VLProcessor
    config = config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    image_processor = Qwen2VLImageProcessorPil(min_pixels=IMAGE_SIDE**2, max_pixels=IMAGE_SIDE**2)
    template = chat_template("<|vision_start|><|image_pad|><|vision_end|>", "<|im_end|>\n")
    processor_class = image_only(processor_class)
    processor = processor_class(image_processor=image_processor, tokenizer=tokenizer, chat_template=template)
    return model_class(config), processor


def gemma3():
    """Gemma 3 (soft-capped logits): one image gives four soft tokens between its begin and end tokens."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    image_tokens = dict(boi_token="<start_of_image>", image_token="<image_soft_token>", eoi_token="<end_of_image>")
    specials = ["<pad>", "<bos>", "<eos>", "<end_of_turn>", *image_tokens.values()]
    tokenizer = character_tokenizer(specials, pad="<pad>", eos="<eos>", extra_special_tokens=image_tokens)
    tokenizer.bos_token = "<bos>"
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in specials}
    config = Gemma3Config(
        text_config=dict(TEXT, vocab_size=len(tokenizer), head_dim=8, final_logit_softcapping=1.5, sliding_window=64),
        vision_config=dict(VISION, image_size=IMAGE_SIDE),
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE})
    template = chat_template("<start_of_image>", "<end_of_turn>\n")
    processor = Gemma3Processor(image_processor, tokenizer, chat_template=template, image_seq_length=4)
    model = Gemma3ForConditionalGeneration(config)
    # transformers initialises the projection into the language model to zeros: every image would read as the same
    # zero vector, and which image a prompt gets would not change its scores.
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.5)
    return model, processor


def llava():
    """LLaVA (a CLIP tower, its class token dropped): one image gives four image tokens."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    specials = ["<pad>", "<s>", "</s>", "<image>"]
    tokenizer = character_tokenizer(specials, pad="<pad>", eos="</s>")
    config = LlavaConfig(
        text_config=dict(TEXT, model_type="llama", vocab_size=len(tokenizer)),
        vision_config=dict(VISION, model_type="clip_vision_model", image_size=IMAGE_SIDE, projection_dim=16),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=4,
        vision_feature_layer=-1,
    )
    side = {"height": IMAGE_SIDE, "width": IMAGE_SIDE}
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIDE}, crop_size=side)
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=chat_template("<image>", "</s>\n"),
    )
    return LlavaForConditionalGeneration(config), processor


def idefics3():
    """Idefics3 (SmolVLM's architecture), images not split: one image gives one token (pixel shuffle of 2 × 2)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    specials = ["<|endoftext|>", "<end_of_utterance>", "<image>", "<fake_token_around_image>", "<global-img>"]
    tokenizer = character_tokenizer(specials, pad="<|endoftext|>", eos="<end_of_utterance>")
    config = Idefics3Config(
        text_config=dict(TEXT, model_type="llama", vocab_size=len(tokenizer)),
        vision_config=dict(VISION, image_size=IMAGE_SIDE),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
    )
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIDE},
        max_image_size={"longest_edge": IMAGE_SIDE},
    )
    template = chat_template("<image>", "<end_of_utterance>\n")
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=1, chat_template=template)
    return Idefics3ForConditionalGeneration(config), processor


FAMILIES = {
    "qwen2_vl": lambda: qwen_vl("2"),
    "qwen2_5_vl": lambda: qwen_vl("2.5"),
    "gemma3": gemma3,
    "llava": llava,
    "idefics3": idefics3,
}


def build_vlm(family: str, seed: int = 0):
    """``(model, processor)`` of ``family``: random weights drawn from ``seed``, float32, the generation config's pad
    and end-of-sequence tokens the tokenizer's. Without a soft-cap, the LM head is scaled up: at its initial scale the
    policy is all but uniform (entropy ln V), with it about as peaked as a trained one (entropy about 2 nats); a
    soft-capped head (Gemma 3's) is left as it is, since the cap would flatten the scaled logits."""
    torch.manual_seed(seed)
    model, processor = FAMILIES[family]()
    if getattr(model.config.get_text_config(), "final_logit_softcapping", None) is None:  # a cap would saturate
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(HEAD_SCALE)
    tokenizer = processor.tokenizer
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.float(), processor


def save_vlm(family: str, path, seed: int = 0) -> str:
    """Save ``build_vlm(family, seed)`` (model and processor) to ``path``, loadable by path as a Hub name is."""
    model, processor = build_vlm(family, seed)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)


def image(seed: int) -> Image.Image:
    """A random 28 × 28 RGB image."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def image_question_dataset(rows: int = 8, seed: int = 0):
    """TRL's image-question shape: an ``image`` column, the prompt as conversational messages (TRL adds the image
    part), and a verifiable ``answer``: the image's brighter half, ``left`` or ``right``."""
    from datasets import Dataset

    images = [image(seed * 1000 + row) for row in range(rows)]
    answers = []
    for picture in images:
        pixels = torch.from_numpy(numpy.asarray(picture, dtype=numpy.float32))
        half = IMAGE_SIDE // 2
        answers.append("left" if pixels[:, :half].mean() >= pixels[:, half:].mean() else "right")
    prompt = [{"role": "user", "content": "Which half is brighter, left or right?"}]
    return Dataset.from_dict({"prompt": [prompt] * rows, "image": images, "answer": answers})


def two_image_dataset(rows: int = 8):
    """TRL's other shape: an ``images`` column (two per row) and prompts whose messages hold the image parts."""
    from datasets import Dataset

    content = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which one is brighter?"}]
    prompt = [{"role": "user", "content": content}]
    images = [[image(2 * row), image(2 * row + 1)] for row in range(rows)]
    return Dataset.from_dict({"prompt": [prompt] * rows, "images": images, "answer": ["first"] * rows})


def answer_reward(completions, answer, **kwargs) -> list[float]:
    """1 when the completion says the answer, else 0."""
    texts = [completion[0]["content"] if isinstance(completion, list) else completion for completion in completions]
    return [float(expected in text) for text, expected in zip(texts, answer, strict=True)]


# The rows of the hand-built micro-batch: one image, two images, none (a mixed batch), one image.
IMAGES_PER_ROW = (1, 2, 0, 1)


def prompt_inputs(processor, images_per_row=IMAGES_PER_ROW, seed: int = 0) -> tuple[dict, list[int]]:
    """The processor's output for one conversational prompt per row holding ``images_per_row[row]`` images, made as
    TRL makes it (the chat template's text, then the processor on the texts and images); and ``num_images``."""
    texts, images = [], []
    for row, count in enumerate(images_per_row):
        pictures = [image(seed * 100 + 10 * row + index) for index in range(count)]
        content = [{"type": "image", "image": picture} for picture in pictures] + [{"type": "text", "text": "Sky?"}]
        messages = [{"role": "user", "content": content}]
        texts.append(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        images.append(pictures)
    inputs = processor(images=images, text=texts, padding=True, return_tensors="pt")
    return dict(inputs), list(images_per_row)


def make_vlm_batch(model, processor, *, completion_len: int = 6, seed: int = 0, images_per_row=IMAGES_PER_ROW):
    """A GRPO micro-batch of a vision-language model as TRL's ``_generate_and_score_completions`` returns it: the
    processor's prompts (left-padded), random completion tokens (characters: never a special token) right-padded,
    the multimodal inputs with per-token ones extended over the completion, ``num_images``, random advantages, and
    rollout and reference log-probs: the model's own from its full logits in float64, plus noise."""
    processed, num_images = prompt_inputs(processor, images_per_row, seed)
    prompt_ids, prompt_mask = processed.pop("input_ids"), processed.pop("attention_mask")
    rows = prompt_ids.size(0)
    generator = torch.Generator().manual_seed(seed)
    tokenizer = processor.tokenizer
    characters = torch.tensor(tokenizer.convert_tokens_to_ids(list(CHARACTERS)))
    completion_ids = characters[torch.randint(len(characters), (rows, completion_len), generator=generator)]
    completion_mask = torch.ones(rows, completion_len, dtype=torch.long)
    completion_mask[1, 3:] = 0  # an early end of sequence
    completion_ids[1, 3:] = tokenizer.pad_token_id
    for key in ("token_type_ids", "mm_token_type_ids"):  # TRL marks the completion text (0)
        if key in processed:
            processed[key] = torch.cat([processed[key], torch.zeros_like(completion_ids)], dim=1)
    multimodal = {**processed, "num_images": num_images}
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([prompt_ids, completion_ids], 1),
            attention_mask=torch.cat([prompt_mask, completion_mask], 1),
            **{key: value for key, value in processed.items()},
        ).logits.double()
    log_softmax = torch.log_softmax(logits[:, prompt_ids.size(1) - 1 : -1], -1)
    log_probs = log_softmax.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1).float()
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=generator),
        "num_items_in_batch": completion_mask.sum(),
        "old_per_token_logps": log_probs + 0.3 * torch.randn(log_probs.shape, generator=generator),
        "ref_per_token_logps": log_probs + 0.2 * torch.randn(log_probs.shape, generator=generator),
        **multimodal,
    }


GROUP_SIZE = 4  # num_generations of every VLM trainer below


def clamped_entropy_controllers() -> list[str]:
    """The methods with a controller whose loss reads the clamped entropy, found by what they do (the registry names
    live in each method's home: tests/unit/test_method_homes.py)."""
    from _support.distributed_run import ADAPTIVE_METHODS
    from trl_entropy.core.parts import MethodPart
    from trl_entropy.methods import METHODS

    def clamps(name):
        return any(
            part.clamp_fraction is not MethodPart.clamp_fraction for part in METHODS[name].config_class.method_parts
        )

    return [name for name in ADAPTIVE_METHODS if clamps(name)]


def covariance_methods() -> list[str]:
    """The methods that select tokens by the covariance of log-prob and advantage (Clip-Cov's and KL-Cov's base)."""
    from trl_entropy.methods import METHODS
    from trl_entropy.methods.cov_selection import CovSelectionPart

    parts = {name: spec.config_class.method_parts for name, spec in METHODS.items()}
    return sorted(name for name, own in parts.items() if any(issubclass(part, CovSelectionPart) for part in own))


def ranked_answer_reward(completions, answer, **kwargs) -> list[float]:
    """:func:`answer_reward` plus the completion's place in its group (0, 0.1, ...): a group's rewards differ
    whatever the policy samples, so every step has advantages and a loss of its own."""
    correct = answer_reward(completions, answer)
    return [value + 0.1 * (index % GROUP_SIZE) for index, value in enumerate(correct)]


def image_placeholder_ids(processor) -> list[int]:
    """The ids of the family's image tokens, which a completion must never hold (the forward would look for an image
    to put there)."""
    tokenizer = processor.tokenizer
    names = ("<|image_pad|>", "<|video_pad|>", "<image_soft_token>", "<image>")
    return [tokenizer.convert_tokens_to_ids(name) for name in names if name in tokenizer.get_vocab()]


def vlm_trainer(
    method: str, model, processor, output_dir: str, dataset=None, trainer_class=None, trainer_kwargs=None, **options
):
    """A trainer of the registered ``method`` (``"trl"``: ``trl.GRPOTrainer``) on ``dataset`` (by default the
    image-question task of :func:`image_question_dataset`): completions sampled from the policy (never an image
    placeholder), ranked rewards, fp32 on the CPU, the method's test options
    (``_support/distributed_run.method_options``), then ``options``; ``trainer_class`` replaces the method's (a
    subclass of it that records something)."""
    from _support.distributed_run import make_trainer

    return make_trainer(
        method,
        model,
        output_dir,
        rollout=None,
        reward=ranked_answer_reward,
        train_dataset=image_question_dataset() if dataset is None else dataset,
        trainer_class=trainer_class,
        trainer_kwargs={"processing_class": processor, **(trainer_kwargs or {})},
        **{
            "max_completion_length": 6,
            "max_steps": 2,
            "generation_kwargs": {"suppress_tokens": image_placeholder_ids(processor)},
            **options,
        },
    )


def vlm_rollout(prompts: list, trainer) -> dict:
    """A TRL ``rollout_func`` for the image-question task whose completions depend only on the image and the copy
    index inside its group (no sampling): one process and two see the same completions. The prompt ids are the
    processor's, placeholders expanded, as TRL's own tokenization gives them."""
    import zlib

    processor = trainer.processing_class
    tokenizer = processor.tokenizer
    seen: dict[bytes, int] = {}
    prompt_ids, completion_ids = [], []
    for prompt in prompts:
        (picture,) = [part["image"] for part in prompt[-1]["content"] if part["type"] == "image"]
        key = picture.tobytes()
        copy = seen[key] = seen.get(key, -1) + 1
        tokenized = processor.apply_chat_template([prompt], add_generation_prompt=True, tokenize=True)
        prompt_ids.append(list(tokenized[0]))
        text = ("left", "right", "no", "up")[(zlib.crc32(key) + copy) % 4]
        completion_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}
