//! A run that stops, saves its model and Adam's state, and resumes in a fresh process-like
//! setting (new model, new optimiser, both loaded) continues exactly as the uninterrupted run.

use backend_cpu::CpuBackend;
use tensor_autograd::Tensor;
use tensor_autograd::models::{mlp, train_step};
use tensor_autograd::nn::{Init, ModuleExt};
use tensor_autograd::optim::Adam;

fn batch(dev: &CpuBackend, i: u64) -> (Tensor<CpuBackend>, Tensor<CpuBackend>) {
    let x = Tensor::randn(dev, &[32, 20], 10 + i).unwrap();
    let y = Tensor::rand(dev, &[32], 50 + i)
        .unwrap()
        .mul_scalar(5.0)
        .unwrap()
        .floor()
        .unwrap()
        .to_dtype(hal::DType::U32)
        .unwrap();
    (x, y)
}

#[test]
fn a_resumed_run_continues_bit_for_bit() {
    let dev = CpuBackend::new();
    let dir = std::env::temp_dir().join(format!("resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (model_path, opt_path) = (dir.join("model.safetensors"), dir.join("adam.safetensors"));
    let adamw = || Adam::adamw(3e-3).weight_decay(0.1);

    // Uninterrupted: 10 steps, saving after the 6th.
    let model = mlp(&mut Init::new(&dev, 5), &[20, 16, 5]).unwrap();
    let params = model.parameters();
    let mut opt = adamw();
    let mut straight = Vec::new();
    for i in 0..10 {
        let (x, y) = batch(&dev, i);
        let out = train_step(&model, &params, &mut opt, &x, &y).unwrap();
        straight.push(out.loss.item().unwrap());
        if i == 5 {
            model.save(&model_path).unwrap();
            opt.save_state(&params, &opt_path).unwrap();
        }
    }

    // Resumed: another initialisation, then the saved model and optimiser, steps 6 to 9.
    let model2 = mlp(&mut Init::new(&dev, 99), &[20, 16, 5]).unwrap();
    model2.load(&model_path).unwrap();
    let params2 = model2.parameters();
    let mut opt2 = adamw();
    opt2.load_state(&params2, &opt_path).unwrap();
    assert_eq!(opt2.steps(), 6);
    let resumed: Vec<f32> = (6..10)
        .map(|i| {
            let (x, y) = batch(&dev, i);
            let out = train_step(&model2, &params2, &mut opt2, &x, &y).unwrap();
            out.loss.item().unwrap()
        })
        .collect();
    assert_eq!(resumed, straight[6..].to_vec());

    // A state file for other parameters is refused, and the optimiser is left as it was.
    let other = mlp(&mut Init::new(&dev, 1), &[20, 8, 5]).unwrap();
    let mut opt3 = adamw();
    let err = opt3.load_state(&other.parameters(), &opt_path).unwrap_err();
    assert!(err.to_string().contains("shape"), "{err}");
    assert_eq!(opt3.steps(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
