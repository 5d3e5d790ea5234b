"""The intermediate-file format: pairs of a ``.dat`` of row changes and a ``.trn`` of events."""
