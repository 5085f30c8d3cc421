# One GEMM block on the `default` config: the load unit brings inputs and weights, the compute unit
# multiplies them into the accumulator and clamps to int8, the store unit writes the result back.
# Dependency flags pass tokens between units: load -> compute -> store.
LOAD inp sram=0 dram=0 y=1 x=1 stride=1                    ; load unit
LOAD wgt sram=0 dram=0 y=1 x=1 stride=1 deps=push_next     ; tell compute the data is there
LOAD uop sram=0 dram=0 y=1 x=1 stride=1                    ; compute unit: one micro-op
GEMM uop=0:1 iter=1x1 dst=0,0 src=0,0 wgt=0,0 reset        ; zero the accumulator row
GEMM uop=0:1 iter=1x1 dst=0,0 src=0,0 wgt=0,0 deps=pop_prev
ALU max uop=0:1 iter=1x1 dst=0,0 src=0,0 imm=-127
ALU min uop=0:1 iter=1x1 dst=0,0 src=0,0 imm=127 deps=push_next
STORE out sram=0 dram=0 y=1 x=1 stride=1 deps=pop_prev     ; store unit
FINISH
