"""The SGLang plugin's tests against SGLang 0.5.23's released code (a package: its conftest stays its own)."""
