"""A product whose operands are registered inside the FPGA's hard multiplier.

On ECP5 a MULT18X18D multiplies in about 3.9 ns (nextpnr-ecp5, speed grade 6), and its sites lie in a few rows
of the die: a fabric register to the multiplier, the multiplier and the route back to a register came to more
than a 10 ns cycle on tiny's ALU after place and route, with no logic on the path at all. Registered inside the
primitive (its input registers), the operands leave the fabric a cycle earlier, so the route to the multiplier
and the multiply fall in different cycles. Yosys maps ``*`` to MULT18X18D without its registers, so the
primitive is instantiated here; everywhere else (simulation, the Xilinx flow, whose ``xilinx_dsp`` pass packs
registers into DSP48s itself) the product is two fabric registers and ``*``.

Yosys ships no simulation model of MULT18X18D, so :class:`Mult18x18dModel` reads the very parameters and
connections the instance gets and does what Lattice's documentation gives for them: the tests simulate the
model in the instance's place.
"""

from __future__ import annotations

from typing import Any

from amaranth import Cat, ClockSignal, Const, Elaboratable, Instance, Module, Mux, Signal, signed
from amaranth.hdl import Value

__all__ = ["MULT18X18D_BITS", "Mult18x18dModel", "fits_mult18x18d", "mult18x18d_ports", "registered_product"]

#: MULT18X18D's operand width (signed where SIGNEDA/SIGNEDB are high) and its product's.
MULT18X18D_BITS, _PRODUCT_BITS = 18, 36


def fits_mult18x18d(v: Value) -> bool:
    """Whether `v` is an operand of MULT18X18D's signed 18 bits as it is (an unsigned value needs a bit more)."""
    return len(v) + (0 if v.shape().signed else 1) <= MULT18X18D_BITS


def mult18x18d_ports(a: Value, b: Value, p: Signal) -> dict[str, Any]:
    """The instance's parameters and connections: A and B (signed 18-bit) registered on CLK0 (enabled by CE0,
    never reset), the product on P without further registers."""
    ports: dict[str, Any] = {
        "p_REG_INPUTA_CLK": "CLK0", "p_REG_INPUTA_CE": "CE0", "p_REG_INPUTA_RST": "RST0",
        "p_REG_INPUTB_CLK": "CLK0", "p_REG_INPUTB_CE": "CE0", "p_REG_INPUTB_RST": "RST0",
        "p_REG_INPUTC_CLK": "NONE", "p_REG_PIPELINE_CLK": "NONE", "p_REG_OUTPUT_CLK": "NONE",
        "p_GSR": "DISABLED", "p_RESETMODE": "SYNC", "p_SOURCEB_MODE": "B_SHIFT", "p_MULT_BYPASS": "DISABLED",
        "i_CLK0": ClockSignal(), "i_CE0": Const(1), "i_RST0": Const(0),
        "i_SIGNEDA": Const(1), "i_SIGNEDB": Const(1), "i_SOURCEA": Const(0), "i_SOURCEB": Const(0),
    }
    # (CLK1 to CLK3 and their enables and resets are left unconnected, as Yosys' own mapping leaves them: tied
    # to constants, the clock inputs' routing from the fabric did not converge in nextpnr)
    for n in range(MULT18X18D_BITS):
        ports.update({f"i_A{n}": a[n], f"i_B{n}": b[n], f"i_C{n}": Const(0)})
    for n in range(_PRODUCT_BITS):
        ports[f"o_P{n}"] = p[n]
    return ports


class Mult18x18dModel(Elaboratable):
    """What MULT18X18D does with the parameters and connections of :func:`mult18x18d_ports`, in Amaranth: the
    operands' input registers where REG_INPUTx_CLK names CLK0 (loading while CE0 is high, cleared by RST0),
    none where it is NONE, and the 36-bit product, each operand signed where SIGNEDx is high."""

    def __init__(self, ports: dict[str, Any]):
        self.ports = ports

    def elaborate(self, platform: object) -> Module:
        m, ports = Module(), self.ports
        assert ports["i_CLK0"].domain == "sync" and ports["p_REG_OUTPUT_CLK"] == "NONE"
        assert ports["p_REG_PIPELINE_CLK"] == "NONE" and ports["p_RESETMODE"] == "SYNC"
        wide = []
        for name in "AB":
            bits: Value = Cat(*[ports[f"i_{name}{n}"] for n in range(MULT18X18D_BITS)])
            clock = ports[f"p_REG_INPUT{name}_CLK"]
            if clock != "NONE":
                assert clock == "CLK0" and ports[f"p_REG_INPUT{name}_CE"] == "CE0"
                assert ports[f"p_REG_INPUT{name}_RST"] == "RST0"
                held = Signal(MULT18X18D_BITS, name=f"model_{name.lower()}")
                with m.If(ports["i_RST0"]):
                    m.d.sync += held.eq(0)
                with m.Elif(ports["i_CE0"]):
                    m.d.sync += held.eq(bits)
                bits = held
            operand = Signal(signed(_PRODUCT_BITS), name=f"model_{name.lower()}_wide")
            m.d.comb += operand.eq(Mux(ports[f"i_SIGNED{name}"], bits.as_signed(), bits.as_unsigned()))
            wide.append(operand)
        m.d.comb += Cat(*[ports[f"o_P{n}"] for n in range(_PRODUCT_BITS)]).eq(wide[0] * wide[1])
        return m


def registered_product(m: Module, x: Value, y: Value, *, primitive: str | None, name: str,
                       model: bool = False) -> Value:
    """``x * y`` of the cycle before (x, y: this cycle's values), in its usual shape. With `primitive`
    "MULT18X18D" (where both operands fit its signed 18 bits) the operands are registered inside the
    multiplier, else in the fabric; `model`: :class:`Mult18x18dModel` in the instance's place, to simulate."""
    shape = (x * y).shape()
    if primitive is None or not (fits_mult18x18d(x) and fits_mult18x18d(y)):
        x_r, y_r = Signal(x.shape(), name=f"{name}_a"), Signal(y.shape(), name=f"{name}_b")
        m.d.sync += [x_r.eq(x), y_r.eq(y)]
        return x_r * y_r
    if primitive != "MULT18X18D":
        raise ValueError(f"no registered multiplier for primitive {primitive!r}")
    a, b = Signal(signed(MULT18X18D_BITS), name=f"{name}_a"), Signal(signed(MULT18X18D_BITS), name=f"{name}_b")
    p = Signal(_PRODUCT_BITS, name=f"{name}_p")
    m.d.comb += [a.eq(x), b.eq(y)]  # (sign- or zero-extended by their shapes)
    ports = mult18x18d_ports(a, b, p)
    m.submodules[name] = Mult18x18dModel(ports) if model else Instance("MULT18X18D", **ports)
    return p[:shape.width].as_signed() if shape.signed else p[:shape.width]
