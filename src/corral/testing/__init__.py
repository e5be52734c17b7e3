"""Test helpers shipped with corral: drive whole lifecycles without processes."""
