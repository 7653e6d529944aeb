"""Parameter-server training on the digits.

On one machine, with its own servers (2 workers, 1 ps, as child processes):
    python examples/train_parameter_server.py
As a job with roles (ps and worker servers, this script on the chief):
    tfpar launch --ps 1 -n 2 -- python examples/train_parameter_server.py
As a Kubeflow TFJob (examples/kubernetes/tfjob-parameter-server.yaml), every pod runs this script:
ParameterServer() serves in the ps and worker pods and trains in the chief.
"""

import argparse

import tfpar
from tfpar.demo import build_model, default_epochs, load_digits
from tfpar.strategies import ParameterServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--epochs", type=int, default=default_epochs(5), help="default 5, or $TFPAR_EPOCHS"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    args = parser.parse_args()

    # Under tfpar launch --ps, TF_CONFIG names the cluster; alone, start a local one.
    strategy = (
        ParameterServer() if tfpar.ClusterInfo.from_tf_config() else ParameterServer.local(2, 1)
    )
    import tensorflow as tf

    keras = tfpar.keras
    (x, y), (x_val, y_val) = load_digits()
    with strategy.scope():
        model = build_model()
        model.compile(
            keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    print(strategy.describe(global_batch_size=args.batch_size, model=model))
    train = tfpar.data.distribute(
        lambda: tf.data.Dataset.from_tensor_slices((x, y)),
        strategy,
        args.batch_size,
        shuffle_buffer=len(x),
    )
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=args.epochs, verbose=2)
    with tf.device("/job:chief/replica:0/task:0/device:CPU:0"):
        accuracy = float((model.predict(x_val, verbose=0).argmax(-1) == y_val).mean())
    print(f"validation accuracy after {args.epochs} epochs: {accuracy:.4f}")


if __name__ == "__main__":
    main()
