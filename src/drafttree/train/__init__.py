"""Training: prompt assembly, self-distillation, feature extraction, head and length-predictor training."""
