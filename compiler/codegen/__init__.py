"""LLVM IR generation: typed builder helpers, kernel emitters, and the whole-model lowering."""
