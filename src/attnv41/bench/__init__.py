"""`attnv41 bench`: decode step and prefill of the 40-layer stack, each kernel alone, the
FlashMLA peer and the index top-k, each against a floor measured in the same run."""
