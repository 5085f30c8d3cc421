"""onnx's own node tests (the cases behind onnx/backend/test/data/node, generated in memory by
onnx.backend.test.case.node) for the ops weft imports, through the float graph on the reference device,
against the outputs onnx stores for them.

Weft needs static shapes, so every graph input after the first is frozen into an initializer with its test
value (scales, axes, split sizes, a second operand). The list holds every case of the ops weft imports
whose first input is float32 (weft compiles float32 models), except these, left out and why:

- ConvTranspose 3-D (weft's ConvTranspose is 1-D or 2-D), 1-D and 3-D pools and dilated pools, MaxPool's
  Indices output, BatchNormalization in training mode, Resize with tf_crop_and_resize, SplitToSequence: not
  supported, each an UnsupportedError naming the node.
- Zero-sized tensors (reduce_*_empty_set, split_zero_size_splits, reshape_allowzero_reordered): weft fixes
  a 0 dimension like a dynamic one.
- pow_types_float32_uint32/uint64, cast/castlike to types weft has no tensors of (float16, bfloat16, the
  float8/4 and int4/2 formats, float64).
- range_float_type_positive_delta: Range computes shapes; weft needs its inputs to be constants.
- resize_downsample_scales_linear_align_corners, resize_downsample_scales_cubic_align_corners: onnx's
  reference maps coordinates with the unrounded output size (scale * size); onnxruntime, which weft
  follows, with the integer output size.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import pytest

import weft

CASES = """
    abs add add_bcast argmax_default_axis_example argmax_default_axis_example_select_last_index
    argmax_default_axis_random argmax_default_axis_random_select_last_index argmax_keepdims_example
    argmax_keepdims_example_select_last_index argmax_keepdims_random argmax_keepdims_random_select_last_index
    argmax_negative_axis_keepdims_example argmax_negative_axis_keepdims_example_select_last_index
    argmax_negative_axis_keepdims_random argmax_negative_axis_keepdims_random_select_last_index
    argmax_no_keepdims_example argmax_no_keepdims_example_select_last_index argmax_no_keepdims_random
    argmax_no_keepdims_random_select_last_index averagepool_2d_ceil averagepool_2d_ceil_last_window_starts_on_pad
    averagepool_2d_default averagepool_2d_pads averagepool_2d_pads_count_include_pad averagepool_2d_precomputed_pads
    averagepool_2d_precomputed_pads_count_include_pad averagepool_2d_precomputed_same_upper
    averagepool_2d_precomputed_strides averagepool_2d_same_lower averagepool_2d_same_upper averagepool_2d_strides
    batchnorm_epsilon batchnorm_example ceil ceil_example celu celu_expanded clip clip_default_inbounds
    clip_default_inbounds_expanded clip_default_max clip_default_max_expanded clip_default_min
    clip_default_min_expanded clip_example clip_example_expanded clip_expanded clip_inbounds clip_inbounds_expanded
    clip_min_greater_than_max clip_min_greater_than_max_expanded clip_outbounds clip_outbounds_expanded
    clip_splitbounds clip_splitbounds_expanded concat_1d_axis_0 concat_1d_axis_negative_1 concat_2d_axis_0
    concat_2d_axis_1 concat_2d_axis_negative_1 concat_2d_axis_negative_2 concat_3d_axis_0 concat_3d_axis_1
    concat_3d_axis_2 concat_3d_axis_negative_1 concat_3d_axis_negative_2 concat_3d_axis_negative_3
    conv_with_autopad_same conv_with_strides_and_asymmetric_padding conv_with_strides_no_padding
    conv_with_strides_padding convtranspose convtranspose_1d convtranspose_autopad_same convtranspose_dilations
    convtranspose_group_2 convtranspose_group_2_image_3 convtranspose_kernel_shape convtranspose_output_shape
    convtranspose_pad convtranspose_pads cos cos_example div div_bcast div_example dropout_default
    dropout_default_mask dropout_default_mask_ratio dropout_default_old dropout_default_ratio dropout_random_old elu
    elu_default elu_default_expanded_ver18 elu_example elu_example_expanded_ver18 elu_expanded_ver18 erf exp
    exp_example expand_dim_changed expand_dim_unchanged flatten_axis0 flatten_axis1 flatten_axis2 flatten_axis3
    flatten_default_axis flatten_negative_axis1 flatten_negative_axis2 flatten_negative_axis3 flatten_negative_axis4
    floor floor_example gather_0 gather_1 gather_2d_indices gather_elements_0 gather_elements_1
    gather_elements_negative_indices gather_negative_indices gelu_default_1 gelu_default_1_expanded gelu_default_2
    gelu_default_2_expanded gelu_tanh_1 gelu_tanh_1_expanded gelu_tanh_2 gelu_tanh_2_expanded gemm_all_attributes
    gemm_alpha gemm_beta gemm_default_matrix_bias gemm_default_no_bias gemm_default_scalar_bias
    gemm_default_single_elem_vector_bias gemm_default_vector_bias gemm_default_zero_bias gemm_transposeA
    gemm_transposeB globalaveragepool globalaveragepool_precomputed globalmaxpool globalmaxpool_precomputed greater
    greater_bcast greater_equal greater_equal_bcast greater_equal_bcast_expanded greater_equal_expanded hardsigmoid
    hardsigmoid_default hardsigmoid_default_expanded_ver18 hardsigmoid_example hardsigmoid_example_expanded_ver18
    hardsigmoid_expanded_ver18 hardswish hardswish_expanded identity instancenorm_epsilon instancenorm_example
    layer_normalization_2d_axis0 layer_normalization_2d_axis0_expanded layer_normalization_2d_axis0_expanded_ver18
    layer_normalization_2d_axis1 layer_normalization_2d_axis1_expanded layer_normalization_2d_axis1_expanded_ver18
    layer_normalization_2d_axis_negative_1 layer_normalization_2d_axis_negative_1_expanded
    layer_normalization_2d_axis_negative_1_expanded_ver18 layer_normalization_2d_axis_negative_2
    layer_normalization_2d_axis_negative_2_expanded layer_normalization_2d_axis_negative_2_expanded_ver18
    layer_normalization_3d_axis0_epsilon layer_normalization_3d_axis0_epsilon_expanded
    layer_normalization_3d_axis0_epsilon_expanded_ver18 layer_normalization_3d_axis1_epsilon
    layer_normalization_3d_axis1_epsilon_expanded layer_normalization_3d_axis1_epsilon_expanded_ver18
    layer_normalization_3d_axis2_epsilon layer_normalization_3d_axis2_epsilon_expanded
    layer_normalization_3d_axis2_epsilon_expanded_ver18 layer_normalization_3d_axis_negative_1_epsilon
    layer_normalization_3d_axis_negative_1_epsilon_expanded
    layer_normalization_3d_axis_negative_1_epsilon_expanded_ver18 layer_normalization_3d_axis_negative_2_epsilon
    layer_normalization_3d_axis_negative_2_epsilon_expanded
    layer_normalization_3d_axis_negative_2_epsilon_expanded_ver18 layer_normalization_3d_axis_negative_3_epsilon
    layer_normalization_3d_axis_negative_3_epsilon_expanded
    layer_normalization_3d_axis_negative_3_epsilon_expanded_ver18 layer_normalization_4d_axis0
    layer_normalization_4d_axis0_expanded layer_normalization_4d_axis0_expanded_ver18 layer_normalization_4d_axis1
    layer_normalization_4d_axis1_expanded layer_normalization_4d_axis1_expanded_ver18 layer_normalization_4d_axis2
    layer_normalization_4d_axis2_expanded layer_normalization_4d_axis2_expanded_ver18 layer_normalization_4d_axis3
    layer_normalization_4d_axis3_expanded layer_normalization_4d_axis3_expanded_ver18
    layer_normalization_4d_axis_negative_1 layer_normalization_4d_axis_negative_1_expanded
    layer_normalization_4d_axis_negative_1_expanded_ver18 layer_normalization_4d_axis_negative_2
    layer_normalization_4d_axis_negative_2_expanded layer_normalization_4d_axis_negative_2_expanded_ver18
    layer_normalization_4d_axis_negative_3 layer_normalization_4d_axis_negative_3_expanded
    layer_normalization_4d_axis_negative_3_expanded_ver18 layer_normalization_4d_axis_negative_4
    layer_normalization_4d_axis_negative_4_expanded layer_normalization_4d_axis_negative_4_expanded_ver18
    layer_normalization_default_axis layer_normalization_default_axis_expanded
    layer_normalization_default_axis_expanded_ver18 leakyrelu leakyrelu_default leakyrelu_default_expanded
    leakyrelu_example leakyrelu_example_expanded leakyrelu_expanded less less_bcast less_equal less_equal_bcast
    less_equal_bcast_expanded less_equal_expanded log log_example logsoftmax_axis_0 logsoftmax_axis_0_expanded
    logsoftmax_axis_0_expanded_ver18 logsoftmax_axis_1 logsoftmax_axis_1_expanded logsoftmax_axis_1_expanded_ver18
    logsoftmax_axis_2 logsoftmax_axis_2_expanded logsoftmax_axis_2_expanded_ver18 logsoftmax_default_axis
    logsoftmax_default_axis_expanded logsoftmax_default_axis_expanded_ver18 logsoftmax_example_1
    logsoftmax_example_1_expanded logsoftmax_example_1_expanded_ver18 logsoftmax_large_number
    logsoftmax_large_number_expanded logsoftmax_large_number_expanded_ver18 logsoftmax_negative_axis
    logsoftmax_negative_axis_expanded logsoftmax_negative_axis_expanded_ver18 lrn lrn_default matmul_1d_1d
    matmul_1d_3d matmul_2d matmul_3d matmul_4d matmul_4d_1d matmul_bcast max_example max_float32 max_one_input
    max_two_inputs maxpool_2d_ceil maxpool_2d_ceil_output_size_reduce_by_one maxpool_2d_default maxpool_2d_pads
    maxpool_2d_precomputed_pads maxpool_2d_precomputed_same_upper maxpool_2d_precomputed_strides
    maxpool_2d_same_lower maxpool_2d_same_upper maxpool_2d_strides mean_example mean_one_input mean_two_inputs
    min_example min_float32 min_one_input min_two_inputs mish mish_expanded mul mul_bcast mul_example neg
    neg_example pow pow_bcast_array pow_bcast_scalar pow_example pow_types_float32_int32 pow_types_float32_int64
    prelu_broadcast prelu_broadcast_expanded prelu_example prelu_example_expanded reciprocal reciprocal_example
    reduce_max_default_axes_keepdim_example reduce_max_default_axes_keepdims_random
    reduce_max_do_not_keepdims_example reduce_max_do_not_keepdims_random reduce_max_keepdims_example
    reduce_max_keepdims_random reduce_max_negative_axes_keepdims_example reduce_max_negative_axes_keepdims_random
    reduce_mean_default_axes_keepdims_example reduce_mean_default_axes_keepdims_random
    reduce_mean_do_not_keepdims_example reduce_mean_do_not_keepdims_random reduce_mean_keepdims_example
    reduce_mean_keepdims_random reduce_mean_negative_axes_keepdims_example reduce_mean_negative_axes_keepdims_random
    reduce_min_default_axes_keepdims_example reduce_min_default_axes_keepdims_random
    reduce_min_do_not_keepdims_example reduce_min_do_not_keepdims_random reduce_min_keepdims_example
    reduce_min_keepdims_random reduce_min_negative_axes_keepdims_example reduce_min_negative_axes_keepdims_random
    reduce_sum_default_axes_keepdims_example reduce_sum_default_axes_keepdims_random
    reduce_sum_do_not_keepdims_example reduce_sum_do_not_keepdims_random reduce_sum_empty_axes_input_noop
    reduce_sum_empty_axes_input_noop_example reduce_sum_keepdims_example reduce_sum_keepdims_random
    reduce_sum_negative_axes_keepdims_example reduce_sum_negative_axes_keepdims_random
    reduce_sum_square_default_axes_keepdims_example reduce_sum_square_default_axes_keepdims_example_expanded
    reduce_sum_square_default_axes_keepdims_random reduce_sum_square_default_axes_keepdims_random_expanded
    reduce_sum_square_do_not_keepdims_example reduce_sum_square_do_not_keepdims_example_expanded
    reduce_sum_square_do_not_keepdims_random reduce_sum_square_do_not_keepdims_random_expanded
    reduce_sum_square_keepdims_example reduce_sum_square_keepdims_example_expanded reduce_sum_square_keepdims_random
    reduce_sum_square_keepdims_random_expanded reduce_sum_square_negative_axes_keepdims_example
    reduce_sum_square_negative_axes_keepdims_example_expanded reduce_sum_square_negative_axes_keepdims_random
    reduce_sum_square_negative_axes_keepdims_random_expanded relu relu_expanded_ver18 reshape_extended_dims
    reshape_negative_dim reshape_negative_extended_dims reshape_one_dim reshape_reduced_dims
    reshape_reordered_all_dims reshape_reordered_last_dims reshape_zero_and_negative_dim reshape_zero_dim
    resize_downsample_scales_cubic resize_downsample_scales_cubic_A_n0p5_exclude_outside
    resize_downsample_scales_cubic_antialias resize_downsample_scales_linear
    resize_downsample_scales_linear_antialias resize_downsample_scales_linear_half_pixel_symmetric
    resize_downsample_scales_nearest resize_downsample_sizes_cubic resize_downsample_sizes_cubic_antialias
    resize_downsample_sizes_linear_antialias resize_downsample_sizes_linear_pytorch_half_pixel
    resize_downsample_sizes_nearest resize_downsample_sizes_nearest_not_larger
    resize_downsample_sizes_nearest_not_smaller resize_upsample_scales_cubic
    resize_upsample_scales_cubic_A_n0p5_exclude_outside resize_upsample_scales_cubic_align_corners
    resize_upsample_scales_cubic_asymmetric resize_upsample_scales_linear
    resize_upsample_scales_linear_align_corners resize_upsample_scales_linear_half_pixel_symmetric
    resize_upsample_scales_nearest resize_upsample_scales_nearest_axes_2_3 resize_upsample_scales_nearest_axes_3_2
    resize_upsample_sizes_cubic resize_upsample_sizes_nearest resize_upsample_sizes_nearest_axes_2_3
    resize_upsample_sizes_nearest_axes_3_2 resize_upsample_sizes_nearest_ceil_half_pixel
    resize_upsample_sizes_nearest_floor_align_corners resize_upsample_sizes_nearest_not_larger
    resize_upsample_sizes_nearest_not_smaller resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric round selu
    selu_default selu_default_expanded_ver18 selu_example selu_example_expanded_ver18 selu_expanded_ver18 shape
    shape_clip_end shape_clip_start shape_end_1 shape_end_negative_1 shape_example shape_start_1 shape_start_1_end_2
    shape_start_1_end_negative_1 shape_start_greater_than_end shape_start_negative_1 sigmoid sigmoid_example sign
    sin sin_example size size_example slice slice_default_axes slice_default_steps slice_end_out_of_bounds slice_neg
    slice_neg_steps slice_negative_axes slice_start_out_of_bounds softmax_axis_0 softmax_axis_0_expanded
    softmax_axis_0_expanded_ver18 softmax_axis_1 softmax_axis_1_expanded softmax_axis_1_expanded_ver18
    softmax_axis_2 softmax_axis_2_expanded softmax_axis_2_expanded_ver18 softmax_default_axis
    softmax_default_axis_expanded softmax_default_axis_expanded_ver18 softmax_example softmax_example_expanded
    softmax_example_expanded_ver18 softmax_large_number softmax_large_number_expanded
    softmax_large_number_expanded_ver18 softmax_negative_axis softmax_negative_axis_expanded
    softmax_negative_axis_expanded_ver18 softplus softplus_example softplus_example_expanded_ver18
    softplus_expanded_ver18 softsign softsign_example softsign_example_expanded_ver18 softsign_expanded_ver18
    split_1d_uneven_split_opset18 split_2d_uneven_split_opset18 split_equal_parts_1d_opset13
    split_equal_parts_1d_opset18 split_equal_parts_2d split_equal_parts_2d_opset13
    split_equal_parts_default_axis_opset13 split_equal_parts_default_axis_opset18 split_variable_parts_1d_opset13
    split_variable_parts_1d_opset18 split_variable_parts_2d_opset13 split_variable_parts_2d_opset18
    split_variable_parts_default_axis_opset13 split_variable_parts_default_axis_opset18 sqrt sqrt_example squeeze
    squeeze_negative_axes sub sub_bcast sub_example sum_example sum_one_input sum_two_inputs tanh tanh_example
    thresholdedrelu thresholdedrelu_default thresholdedrelu_default_expanded_ver18 thresholdedrelu_example
    thresholdedrelu_example_expanded_ver18 thresholdedrelu_expanded_ver18 tile tile_precomputed
    transpose_all_permutations_0 transpose_all_permutations_1 transpose_all_permutations_2
    transpose_all_permutations_3 transpose_all_permutations_4 transpose_all_permutations_5 transpose_default
    unsqueeze_axis_0 unsqueeze_axis_1 unsqueeze_axis_2 unsqueeze_negative_axes unsqueeze_three_axes
    unsqueeze_two_axes unsqueeze_unsorted_axes upsample_nearest
""".split()


@functools.cache
def _cases() -> dict[str, object]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx's generators warn about their own overflow cases
        return {case.name: case for case in collect_testcases(None)}


def _frozen(case: object) -> tuple[onnx.ModelProto, list[tuple[dict[str, np.ndarray], list[np.ndarray]]]]:
    """The case's model with every graph input after the first turned into an initializer."""
    model = onnx.ModelProto.FromString(case.model.SerializeToString())
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    first_inputs, _ = case.data_sets[0]
    for vi, value in list(zip(inputs, first_inputs, strict=True))[1:]:
        model.graph.initializer.append(onnx.numpy_helper.from_array(value, vi.name))
        model.graph.input.remove(vi)
    data = [({inputs[0].name: ins[0]}, list(outs)) for ins, outs in case.data_sets
            if all(np.array_equal(a, b) for a, b in zip(ins[1:], first_inputs[1:], strict=True))]
    return model, data


@pytest.mark.parametrize("name", CASES)
def test_onnx_node_case(name):
    case = _cases()[f"test_{name}"]
    model, data = _frozen(case)
    assert data
    art = weft.compile(model, target="cpu")
    session = weft.InferenceSession(art, device="ref")
    for feeds, want in data:
        got = session.run(None, feeds)
        assert len(got) == len(want)
        for out, a, b in zip(model.graph.output, got, want, strict=True):
            assert a.shape == b.shape, out.name
            np.testing.assert_allclose(a, b, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6), err_msg=out.name)
