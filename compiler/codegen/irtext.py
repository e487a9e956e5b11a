"""LLVM IR text of llvmlite functions and modules, the same characters as ``str()``, printed faster.

Why: a cold compile prints every kernel it builds (the model's and the tuner's candidates), and
llvmlite's printer goes through several layers of ``str.format`` per instruction: about a fifth of
ResNet-18's cold compile, all on the core that lowers. Here the instructions the kernels are made of
(arithmetic, GEP, load/store, casts, calls, vector shuffles, phi, select, compares, branches) are
printed with one f-string each; any other instruction, or one with metadata, attributes or
fast-math flags, is printed by llvmlite itself. The text is llvmlite's, character for character
(``tests/compiler/codegen/test_irtext.py`` compares both on kernels of named profiles), so the
objects LLVM makes of it are the same.
"""

from __future__ import annotations

from llvmlite import ir
from llvmlite.ir import instructions as ins


def _typed(ops) -> str:
    return ", ".join([f"{o.type} {o.get_reference()}" for o in ops])


def _align(i: ins.Instruction) -> str:
    return f", align {i.align:d}" if i.align is not None else ""


def _call(i: ins.CallInstr) -> str | None:
    if i.arg_attributes or i.attributes or i.fastmath:
        return None
    callee = i.callee
    fnty = callee.function_type
    ref = f"{fnty if fnty.var_arg else fnty.return_type} {callee.get_reference()}"
    if i.cconv:
        ref = f"{i.cconv} {ref}"
    tail = f"{i.tail} " if i.tail else ""
    return f"{tail}{i.opname} {ref}({_typed(i.args)})"


def _gep(i: ins.GEPInstr) -> str:
    p = i.pointer
    op = "getelementptr inbounds" if i.inbounds else "getelementptr"
    return f"{op} {i.source_etype}, {p.type} {p.get_reference()}, {_typed(i.indices)} "


def _arith(i: ins.Instruction) -> str:
    op = " ".join([i.opname] + i.flags) if i.flags else i.opname
    return f"{op} {i.type} {', '.join([o.get_reference() for o in i.operands])}"


def _cast(i: ins.CastInstr) -> str:
    o = i.operands[0]
    return f"{i.opname} {o.type} {o.get_reference()} to {i.type} "


def _load(i: ins.LoadInstr) -> str:
    o = i.operands[0]
    return f"load {i.type}, {o.type} {o.get_reference()}{_align(i)}"


def _store(i: ins.StoreInstr) -> str:
    v, p = i.operands
    return f"store {v.type} {v.get_reference()}, {p.type} {p.get_reference()}{_align(i)}"


def _vector(i: ins.Instruction) -> str:
    return f"{i.opname} {_typed(i.operands)}"


def _phi(i: ins.PhiInstr) -> str:
    incs = ", ".join([f"[{v.get_reference()}, {b.get_reference()}]" for v, b in i.incomings])
    return f"phi {' '.join(i.flags)} {i.type} {incs} "


def _select(i: ins.SelectInstr) -> str:
    return f"select {' '.join(i.flags)} {_typed(i.operands)} "


def _compare(i: ins.CompareInstr) -> str:
    a, b = i.operands
    flags = "".join([" " + f for f in i.flags])
    return f"{i.opname}{flags} {i.op} {a.type} {a.get_reference()}, {b.get_reference()} "


def _branch(i: ins.Terminator) -> str:
    return f"{i.opname} {_typed(i.operands)}"


def _ret(i: ins.Ret) -> str:
    v = i.return_value
    return f"{i.opname} {v.type} {v.get_reference()}" if v is not None else i.opname


_BODY = {ins.Instruction: _arith, ins.CallInstr: _call, ins.GEPInstr: _gep, ins.CastInstr: _cast,
         ins.LoadInstr: _load, ins.StoreInstr: _store, ins.ShuffleVector: _vector, ins.InsertElement: _vector,
         ins.ExtractElement: _vector, ins.PhiInstr: _phi, ins.SelectInstr: _select, ins.ICMPInstr: _compare,
         ins.FCMPInstr: _compare, ins.Branch: _branch, ins.ConditionalBranch: _branch, ins.Ret: _ret}


def instruction_text(i: ins.Instruction) -> str:
    """``str(i)``: one instruction, without indent or newline."""
    body = _BODY.get(i.__class__)
    text = body(i) if body is not None and not i.metadata else None
    if text is None:
        return str(i)
    if isinstance(i.type, ir.VoidType):
        return text.rstrip()
    return f"{i.get_reference()} = {text}".rstrip()


def function_text(fn: ir.Function, taken: str = "") -> str:
    """``str(fn)``: a declaration, or a definition with its blocks; ``taken``: the text
    :func:`take_instructions` took from its one block so far, printed ahead of what the block holds now."""
    buf: list[str] = []
    fn.descr_prototype(buf)
    if fn.blocks:
        buf.append("{\n")
        for block in fn.blocks:
            buf.append(f"{block._format_name()}:\n")
            buf.append(taken)
            taken = ""
            buf += [f"  {instruction_text(i)}\n" for i in block.instructions]
        buf.append("}\n")
    return "".join(buf)


def take_instructions(fn: ir.Function) -> str:
    """The text of the instructions ``fn``'s one block holds, which then leave it: a function still being
    built (a model's entry point gains a call or two per node, and LSTM KWS's held 4,543 instructions,
    ~3 MiB, until lowering ended) need not keep them all to be printed at its end. Only for a block
    that is appended to (a builder inserting ahead of them would put its instruction after their text);
    its builder goes on at the block's end (``position_at_end``). :func:`function_text` joins the parts."""
    (block,) = fn.blocks
    text = "".join([f"  {instruction_text(i)}\n" for i in block.instructions])
    block.instructions.clear()
    return text


def drop_body(fn: ir.Function) -> None:
    """Forget ``fn``'s blocks once printed (a call to it needs only its signature), and the edges that
    make each loop a reference cycle (a phi and the instruction feeding it back; a block's terminator,
    which branches to the block): reference counting then frees the body at once, where the cyclic
    collector, off while a model is lowered and rare in its oldest generation while candidates are
    tuned, kept it (SqueezeNet's tuning held 6 MiB of candidates' bodies; MobileNetV2's lowering raised
    its cold peak by 6 MiB). Its scope, which holds every name its instructions took, starts afresh."""
    for block in fn.blocks:
        for i in block.instructions:
            if isinstance(i, ins.PhiInstr):
                i.incomings.clear()
        block.instructions.clear()
        block.terminator = None
    fn.blocks.clear()
    fn.scope = type(fn.scope)()  # the names its instructions took: ~100 bytes each, 7 MiB of MobileNetV3's


def global_text(v: ir.GlobalValue) -> str:
    """``str(v)`` of a module's global: functions through :func:`function_text`."""
    return function_text(v) if isinstance(v, ir.Function) else str(v)


def module_text(module: ir.Module) -> str:
    """``str(module)``."""
    lines = [f'; ModuleID = "{module.name}"', f'target triple = "{module.triple}"',
             f'target datalayout = "{module.data_layout}"', ""]
    lines += [t.get_declaration() for t in module.get_identified_types().values()]
    lines += [global_text(v) for v in module.globals.values()]
    lines += module._get_metadata_lines()
    return "\n".join(lines)
