"""The toy tokenizer (one token per character) and the tiny Llama-architecture causal LM sized to it."""

import torch

from .task import _SPECIAL_TOKENS, TOY_ALPHABET, TOY_BOS_TOKEN, TOY_EOS_TOKEN, TOY_PAD_TOKEN, TOY_UNK_TOKEN


TOY_MODEL_MAX_LENGTH = 64


def build_toy_tokenizer(model_max_length: int = TOY_MODEL_MAX_LENGTH):
    """Return a character-level ``transformers.PreTrainedTokenizerFast`` for the toy task.

    Every character of ``TOY_ALPHABET`` is one token; ``<pad>`` (id 0), ``<bos>`` (1), ``<eos>`` (2) and ``<unk>`` (3)
    are special tokens. No special token is added when encoding (the bos token exists for configs only), and the
    decoder concatenates tokens, so ``tokenizer.decode(tokenizer.encode(s)) == s`` for any string over the alphabet.
    Padding and truncation are on the left, as GRPO generation needs. There is no chat template: prompts are plain
    text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*_SPECIAL_TOKENS, *TOY_ALPHABET))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=TOY_UNK_TOKEN))
    # One pre-token per character, whitespace included ("isolated" keeps the matched character as its own piece).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Without a decoder, `tokenizers` joins tokens with spaces; Fuse concatenates them as they are.
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=TOY_PAD_TOKEN,
        bos_token=TOY_BOS_TOKEN,
        eos_token=TOY_EOS_TOKEN,
        unk_token=TOY_UNK_TOKEN,
        padding_side="left",
        truncation_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    return tokenizer


def build_toy_model(tokenizer, seed: int = 0, **overrides):
    """Return a tiny randomly initialised ``LlamaForCausalLM`` (float32, eval mode) sized to ``tokenizer``.

    Defaults: hidden size 64, 2 layers, 4 attention heads, MLP width 128, tied input/output embeddings, vocabulary,
    pad/bos/eos ids and maximum length taken from the tokenizer. Any ``LlamaConfig`` field can be overridden by
    keyword, e.g. ``tie_word_embeddings=False`` or ``num_hidden_layers=1``. The weights depend only on ``seed`` (the
    global torch RNG state is saved and restored around the initialisation). The generation config carries the
    pad/bos/eos ids so ``model.generate`` stops at ``<eos>``.

    Llama rather than Qwen2 on purpose: for a saved ``qwen2`` checkpoint, ``AutoTokenizer.from_pretrained`` swaps in
    ``Qwen2Tokenizer``, whose byte-level pipeline drops the spaces of this character-level vocabulary; for ``llama``
    it loads the saved tokenizer as it is (so ``GRPOTrainer(model=<cached path>)`` without a processing class works).
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config_kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max(tokenizer.model_max_length, 64),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        use_cache=True,
    )
    config_kwargs.update(overrides)
    config = LlamaConfig(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_new_tokens=8,
    )
    return model.float().eval()
