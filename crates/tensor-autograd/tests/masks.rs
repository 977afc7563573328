//! `tril`, `triu` and `masked_fill`: PyTorch's values (written out here), gradients that pass
//! only where the value was kept, and clear errors for shapes that do not fit.

use backend_cpu::CpuBackend;
use tensor_autograd::Tensor;

#[test]
fn triangles_match_pytorch_and_pass_gradients_where_kept() {
    let dev = CpuBackend::new();
    let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
        .unwrap()
        .requires_grad();
    // torch.tril(x) = [[1, 0, 0], [4, 5, 0]]; torch.tril(x, 1) = [[1, 2, 0], [4, 5, 6]];
    // torch.triu(x, 1) = [[0, 2, 3], [0, 0, 6]]; torch.tril(x, -1) = [[0, 0, 0], [4, 0, 0]].
    assert_eq!(
        x.tril(0).unwrap().to_vec().unwrap(),
        [1.0, 0.0, 0.0, 4.0, 5.0, 0.0]
    );
    assert_eq!(
        x.tril(1).unwrap().to_vec().unwrap(),
        [1.0, 2.0, 0.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(
        x.triu(1).unwrap().to_vec().unwrap(),
        [0.0, 2.0, 3.0, 0.0, 0.0, 6.0]
    );
    assert_eq!(
        x.tril(-1).unwrap().to_vec().unwrap(),
        [0.0, 0.0, 0.0, 4.0, 0.0, 0.0]
    );
    x.tril(0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec().unwrap(),
        [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    );
    // Batched: the last two dimensions.
    let b = Tensor::from_slice(&dev, &[1.0; 8], &[2, 2, 2]).unwrap();
    assert_eq!(
        b.triu(0).unwrap().to_vec().unwrap(),
        [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    );
    assert!(
        Tensor::from_slice(&dev, &[1.0], &[1])
            .unwrap()
            .tril(0)
            .is_err()
    );
}

#[test]
fn masked_fill_broadcasts_the_mask_and_keeps_the_shape() {
    let dev = CpuBackend::new();
    let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2])
        .unwrap()
        .requires_grad();
    let mask = Tensor::from_elements(&dev, &[0u32, 1], &[2]).unwrap();
    let y = x.masked_fill(&mask, f64::NEG_INFINITY).unwrap();
    assert_eq!(
        y.to_vec().unwrap(),
        [1.0, f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY]
    );
    x.masked_fill(&mask, 0.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(x.grad().unwrap().to_vec().unwrap(), [1.0, 0.0, 1.0, 0.0]);
    // A mask that would grow the tensor is refused.
    let wide = Tensor::from_elements(&dev, &[0u32; 6], &[3, 1, 2]).unwrap();
    assert!(x.masked_fill(&wide, 0.0).is_err());
}
