"""Measuring the detectors: ``trainsignals.eval.bench`` scores a Monitor (or any detector) on a
labeled suite beside the baselines of ``trainsignals.eval.baselines``.
"""
