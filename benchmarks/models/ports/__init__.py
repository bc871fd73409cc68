"""Hand-style ports of twelve Hugging Face families, torch or paddle, with mistakes planted in their source: the `port`
form of the seeded-bug benchmark (`benchmarks/mutants.py --forms port`), and the `decode_port` form
(`--forms decode_port`): the eight decoders' ports with their own cache, decoded step by step by `bisectr generate`
against the Hugging Face model decoding with its `DynamicCache`, mistakes planted only at lines that run at decode
steps.

- `references.py`: the families' Hugging Face references, from tiny random configs (`families.py`'s, and Bloom,
  Falcon, T5 and ResNet added).
- `architectures.py`: what each family computes and where its reference keeps each weight, as the writer reads it
  (`DECODING_ARCHS`: Gemma-2 and Mixtral with a sliding window shorter than the prompt).
- `choices.py`: the structural choices a porter makes (module tree and names, fusions, rotary convention, where masks
  and tables are computed, norms, activations, linear layers, attention, ...), drawn where they apply; a decoding
  port's too (`DECODING_CHOICES`: the cache's layout, positions from the cache's length or `position_ids`, the step's
  mask offset by the cache's length or the attention_mask's width, how much a sliding layer's cache keeps).
- `dialect.py`: how torch and paddle spell each construct.
- `layers.py`: the pieces of every port as source text (linear layers, norms, activations, position tables, masks,
  attention, MLPs, MoE), each with the converter lines that fill its weights.
- `transformer.py`, `t5.py`, `resnet.py`: the model-level writers (decoders, BERT and ViT; T5; ResNet) and their
  converters.
- `decoding.py`: a decoding port's own pieces: its cache class (grown by concatenation, a sliding layer's rolling),
  the step's positions, masks and tables, the lines that run at decode steps marked, and its decoding mistakes
  (`KINDS`: an offset not advanced, k cached before the rotary, the step's mask off by one, the cache in bfloat16,
  k and v concatenated wrong or kept swapped) registered with the lines they rewrite.
- `writer.py`: `write(family, framework, choices, names)`, the port's whole source (classes, `build`, `convert`,
  `load`), one statement per line; `written(...)` with a decoding port's decode lines and mistakes.
- `mutate.py`: the six mutation kinds, each site a node of the port's syntax tree replaced on its own line.
- `running.py`: a port run as a module, in its framework, and in float64.
- `locate.py`: where a mistake is: the modules a forward line runs in, the leaves a converter's mistake changes.
- `cases.py`: a case drawn from its seed (framework, choices, a valid site), cached with its port's file.
- `pair.py`: the bisectr model file of a case (`BISECTR_MUTANT=FAMILY:KIND:SEED:port`).
- `greedy.py`: greedy decoding step by step, teacher-forced, as `bisectr generate` drives a causal LM (the reference
  with its `DynamicCache`, a decoding port with its cache), each step's logits and cache.
- `decode_cases.py`: a `decode_port` case drawn from its seed (a decoding port, a valid site at its decode lines, the
  first step its logits show the mistake and the step its code first has an effect at), cached.
- `decode_pair.py`: the `bisectr generate` model file of such a case (`BISECTR_MUTANT=FAMILY:KIND:SEED:decode_port`).
"""
