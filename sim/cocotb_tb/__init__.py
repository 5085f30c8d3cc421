"""cocotb testbenches for the generated Verilog: the DRAM model, the testbench class, and the test module
that the cosimulation driver (:mod:`weft.sim.cosim`) runs inside Icarus or Verilator.

These modules import cocotb and run inside a simulator; nothing else in weft imports them.
"""
