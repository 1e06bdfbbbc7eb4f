"""Tools above the training app: trained-model loading, generate, score, diagnose, run reading and reports."""
