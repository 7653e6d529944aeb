"""Horovod ring all-reduce as a Keras strategy, on the digits.

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_horovod.py
    tfpar launch --horovod -n 2 -- python examples/train_horovod.py      (the same)
    python examples/train_horovod.py                                     (one rank)

Needs Horovod: pip install ".[horovod]" && tfpar install-horovod (in the tfpar checkout)
"""

import argparse

import tfpar
from tfpar.demo import build_model, default_epochs, load_digits
from tfpar.strategies.horovod import HorovodStrategy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--epochs", type=int, default=default_epochs(5), help="default 5, or $TFPAR_EPOCHS"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--compression", default="none", help="none or fp16")
    parser.add_argument(
        "--backward-passes", type=int, default=1, help="gradient accumulation steps"
    )
    parser.add_argument(
        "--checkpoint-dir", help="save weights here after every epoch (rank 0 writes)"
    )
    parser.add_argument(
        "--warmup-epochs",
        type=float,
        default=1.0,
        help="warm up to the learning rate x ranks (linear scaling rule)",
    )
    args = parser.parse_args()

    strategy = HorovodStrategy(
        compression=args.compression, backward_passes_per_step=args.backward_passes
    )
    import tensorflow as tf

    keras = tfpar.keras
    (x, y), (x_val, y_val) = load_digits()
    with strategy.scope():
        model = build_model()
        model.compile(
            keras.optimizers.Adam(1e-3),
            "sparse_categorical_crossentropy",
            weighted_metrics=["accuracy"],
        )
    chief = strategy.rank == 0
    if chief:
        print(strategy.describe(global_batch_size=args.batch_size, model=model))
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)),
        strategy,
        args.batch_size,
        shuffle_buffer=len(x),
        seed=0,
    )
    val = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x_val, y_val)), strategy, args.batch_size
    )
    callbacks = [tfpar.callbacks.LearningRateWarmup(warmup_epochs=args.warmup_epochs)]
    if args.checkpoint_dir:
        callbacks.append(
            keras.callbacks.ModelCheckpoint(
                f"{args.checkpoint_dir}/epoch_{{epoch}}", save_weights_only=True
            )
        )
    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=args.epochs,
        validation_data=val.dataset,
        validation_steps=val.steps_per_epoch,
        callbacks=callbacks,
        verbose=2,  # HorovodStrategy keeps ranks > 0 quiet
    )
    if chief:
        print(
            f"validation accuracy after {args.epochs} epochs: "
            f"{history.history['val_accuracy'][-1]:.4f}"
        )


if __name__ == "__main__":
    main()
