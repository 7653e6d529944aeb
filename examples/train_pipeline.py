"""Pipeline-parallel training on the digits: the CNN cut into 2 stages on 2 devices.

    python examples/train_pipeline.py                       # 2 stages, 1F1B, 8 microbatches
    python examples/train_pipeline.py --replicas 2          # 2 stages x 2 data-parallel replicas
    python examples/train_pipeline.py --schedule gpipe --recompute
    tfpar launch -n 2 -- python examples/train_pipeline.py --span-workers   # stage 1 on worker 1

Each stage's variables live on its own device (GPUs, or virtual CPU devices
here); the trained weights are copied back into the plain model, which is
saved and loaded as any Keras model.
"""

import argparse
import os
import tempfile

import tfpar
from tfpar.demo import build_model, default_epochs, load_digits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--epochs", type=int, default=default_epochs(5), help="default 5, or $TFPAR_EPOCHS"
    )
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    parser.add_argument(
        "--recompute", action="store_true", help="recompute activations in the backward pass"
    )
    parser.add_argument(
        "--span-workers",
        action="store_true",
        help="under tfpar launch: the stages spread over the workers (worker 0 runs the pipeline)",
    )
    args = parser.parse_args()

    tfpar.configure_devices(2 * args.replicas)  # one device per stage and replica
    # First, before TensorFlow runs anything: under tfpar launch it joins the job (with
    # --span-workers, a worker other than 0 serves its devices here until worker 0 is done, and goes
    # no further).
    pipeline = tfpar.pipeline.Pipeline(
        num_stages=2,
        num_microbatches=args.microbatches,
        schedule=args.schedule,
        replicas=args.replicas,
        recompute=args.recompute,
        balance="time",
        span_workers=args.span_workers,
    )
    keras = tfpar.keras
    keras.utils.set_random_seed(0)
    (x, y), (x_val, y_val) = load_digits()
    model = pipeline.stage(build_model())
    model.compile(
        keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    batch = 32 * args.replicas
    print(pipeline.describe(global_batch_size=batch, model=model))
    usable = len(x) // batch * batch  # every batch divides into microbatches
    model.fit(
        x[:usable],
        y[:usable],
        batch_size=batch,
        epochs=args.epochs,
        verbose=2,
        callbacks=[tfpar.callbacks.PipelineBubble()],
    )
    plain = model.plain_model()
    path = os.path.join(tempfile.mkdtemp(), "digits.keras")
    plain.save(path)
    loaded = keras.models.load_model(path)
    accuracy = (loaded.predict(x_val, verbose=0).argmax(-1) == y_val).mean()
    print(
        f"validation accuracy of the saved plain model after {args.epochs} epochs: {accuracy:.4f}"
    )


if __name__ == "__main__":
    main()
