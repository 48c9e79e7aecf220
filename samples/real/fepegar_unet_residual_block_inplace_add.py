# source: https://github.com/fepegar/unet/issues/36 — issue "Error with inplace operations due to recent changes in pytorch": UNet2D(..., residual=True) fails in backward with "one of the variables needed for gradient computation has been modified by an inplace operation" because EncodingBlock/DecodingBlock.forward do `x += connection` on the ReLU output of conv2
# fix-source: https://github.com/fepegar/unet/commit/caace5c8a2492cddd162a132dc9509f983fb46e3 — merged PR #37 "Fixing inplace operation error": `x += connection` -> `x = x + connection` in unet/encoding.py and unet/decoding.py
# expect-kind: inplace-modified
# expect-culprit: x
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

CHANNELS_DIMENSION = 1


class ConvolutionalBlock(nn.Module):
    def __init__(
            self,
            dimensions: int,
            in_channels: int,
            out_channels: int,
            normalization: Optional[str] = None,
            kernel_size: int = 3,
            activation: Optional[str] = 'ReLU',
            padding: int = 0,
            ):
        super().__init__()

        block = nn.ModuleList()

        if padding:
            total_padding = kernel_size - 1
            padding = total_padding // 2

        class_name = 'Conv{}d'.format(dimensions)
        conv_class = getattr(nn, class_name)
        no_bias = normalization is not None
        conv_layer = conv_class(
            in_channels,
            out_channels,
            kernel_size,
            padding=padding,
            bias=not no_bias,
        )

        norm_layer = None
        if normalization is not None:
            class_name = '{}Norm{}d'.format(
                normalization.capitalize(), dimensions)
            norm_class = getattr(nn, class_name)
            norm_layer = norm_class(out_channels)

        activation_layer = None
        if activation is not None:
            activation_layer = getattr(nn, activation)()

        self.add_if_not_none(block, conv_layer)
        self.add_if_not_none(block, norm_layer)
        self.add_if_not_none(block, activation_layer)

        self.conv_layer = conv_layer
        self.norm_layer = norm_layer
        self.activation_layer = activation_layer

        self.block = nn.Sequential(*block)

    def forward(self, x):
        return self.block(x)

    @staticmethod
    def add_if_not_none(module_list, module):
        if module is not None:
            module_list.append(module)


class Encoder(nn.Module):
    def __init__(self, in_channels, out_channels_first, dimensions, pooling_type,
                 num_encoding_blocks, normalization, residual=False, padding=0,
                 activation='ReLU'):
        super().__init__()

        self.encoding_blocks = nn.ModuleList()
        is_first_block = True
        for _ in range(num_encoding_blocks):
            encoding_block = EncodingBlock(
                in_channels,
                out_channels_first,
                dimensions,
                normalization,
                pooling_type,
                is_first_block=is_first_block,
                residual=residual,
                padding=padding,
                activation=activation,
            )
            is_first_block = False
            self.encoding_blocks.append(encoding_block)
            in_channels = out_channels_first
            out_channels_first = in_channels * 2

    def forward(self, x):
        skip_connections = []
        for encoding_block in self.encoding_blocks:
            x, skip_connnection = encoding_block(x)
            skip_connections.append(skip_connnection)
        return skip_connections, x

    @property
    def out_channels(self):
        return self.encoding_blocks[-1].out_channels


class EncodingBlock(nn.Module):
    def __init__(self, in_channels, out_channels_first, dimensions, normalization,
                 pooling_type, is_first_block=False, residual=False, padding=0,
                 activation='ReLU'):
        super().__init__()

        self.normalization = normalization
        self.residual = residual

        if is_first_block:
            normalization = None
        else:
            normalization = self.normalization

        self.conv1 = ConvolutionalBlock(
            dimensions, in_channels, out_channels_first,
            normalization=normalization, padding=padding, activation=activation)

        out_channels_second = out_channels_first
        self.conv2 = ConvolutionalBlock(
            dimensions, out_channels_first, out_channels_second,
            normalization=self.normalization, padding=padding, activation=activation)

        if residual:
            self.conv_residual = ConvolutionalBlock(
                dimensions, in_channels, out_channels_second,
                kernel_size=1, normalization=None, activation=None)

        self.downsample = None
        if pooling_type is not None:
            class_name = '{}Pool{}d'.format(pooling_type.capitalize(), dimensions)
            self.downsample = getattr(nn, class_name)(2)

    def forward(self, x):
        if self.residual:
            connection = self.conv_residual(x)
            x = self.conv1(x)
            x = self.conv2(x)
            x += connection
        else:
            x = self.conv1(x)
            x = self.conv2(x)
        if self.downsample is None:
            return x
        else:
            skip_connection = x
            x = self.downsample(x)
            return x, skip_connection

    @property
    def out_channels(self):
        return self.conv2.conv_layer.out_channels


class Decoder(nn.Module):
    def __init__(self, in_channels_skip_connection, dimensions, upsampling_type,
                 num_decoding_blocks, normalization, residual=False, padding=0,
                 activation='ReLU'):
        super().__init__()
        self.decoding_blocks = nn.ModuleList()
        for _ in range(num_decoding_blocks):
            decoding_block = DecodingBlock(
                in_channels_skip_connection,
                dimensions,
                upsampling_type,
                normalization=normalization,
                residual=residual,
                padding=padding,
                activation=activation,
            )
            self.decoding_blocks.append(decoding_block)
            in_channels_skip_connection //= 2

    def forward(self, skip_connections, x):
        zipped = zip(reversed(skip_connections), self.decoding_blocks)
        for skip_connection, decoding_block in zipped:
            x = decoding_block(skip_connection, x)
        return x


class DecodingBlock(nn.Module):
    def __init__(self, in_channels_skip_connection, dimensions, upsampling_type,
                 normalization, residual=False, padding=0, activation='ReLU'):
        super().__init__()

        self.residual = residual

        if upsampling_type == 'conv':
            in_channels = out_channels = 2 * in_channels_skip_connection
            conv_class = getattr(nn, 'ConvTranspose{}d'.format(dimensions))
            self.upsample = conv_class(in_channels, out_channels, kernel_size=2, stride=2)
        in_channels_first = in_channels_skip_connection * (1 + 2)
        out_channels = in_channels_skip_connection
        self.conv1 = ConvolutionalBlock(
            dimensions, in_channels_first, out_channels,
            normalization=normalization, padding=padding, activation=activation)
        in_channels_second = out_channels
        self.conv2 = ConvolutionalBlock(
            dimensions, in_channels_second, out_channels,
            normalization=normalization, padding=padding, activation=activation)

        if residual:
            self.conv_residual = ConvolutionalBlock(
                dimensions, in_channels_first, out_channels,
                kernel_size=1, normalization=None, activation=None)

    def forward(self, skip_connection, x):
        x = self.upsample(x)
        skip_connection = self.center_crop(skip_connection, x)
        x = torch.cat((skip_connection, x), dim=CHANNELS_DIMENSION)
        if self.residual:
            connection = self.conv_residual(x)
            x = self.conv1(x)
            x = self.conv2(x)  # culprit
            x += connection  # step
        else:
            x = self.conv1(x)
            x = self.conv2(x)
        return x

    def center_crop(self, skip_connection, x):
        skip_shape = torch.tensor(skip_connection.shape)
        x_shape = torch.tensor(x.shape)
        crop = skip_shape[2:] - x_shape[2:]
        half_crop = (crop / 2).int()
        pad = -torch.stack((half_crop, half_crop)).t().flatten()
        skip_connection = F.pad(skip_connection, pad.tolist())
        return skip_connection


class UNet(nn.Module):
    def __init__(self, in_channels=1, out_classes=2, dimensions=2, num_encoding_blocks=5,
                 out_channels_first_layer=64, normalization=None, pooling_type='max',
                 upsampling_type='conv', residual=False, padding=0, activation='ReLU'):
        super().__init__()
        depth = num_encoding_blocks - 1

        # Force padding if residual blocks
        if residual:
            padding = 1

        # Encoder
        self.encoder = Encoder(
            in_channels, out_channels_first_layer, dimensions, pooling_type, depth,
            normalization, residual=residual, padding=padding, activation=activation)

        # Bottom (last encoding block)
        in_channels = self.encoder.out_channels
        out_channels_first = 2 * in_channels
        self.bottom_block = EncodingBlock(
            in_channels, out_channels_first, dimensions, normalization,
            pooling_type=None, residual=residual, padding=padding, activation=activation)

        # Decoder
        power = depth - 1
        in_channels_skip_connection = out_channels_first_layer * 2**power
        num_decoding_blocks = depth
        self.decoder = Decoder(
            in_channels_skip_connection, dimensions, upsampling_type, num_decoding_blocks,
            normalization=normalization, residual=residual, padding=padding,
            activation=activation)

        # Classifier
        in_channels = out_channels_first_layer
        self.classifier = ConvolutionalBlock(
            dimensions, in_channels, out_classes, kernel_size=1, activation=None)

    def forward(self, x):
        skip_connections, encoding = self.encoder(x)
        encoding = self.bottom_block(encoding)
        x = self.decoder(skip_connections, encoding)
        return self.classifier(x)


class UNet2D(UNet):
    def __init__(self, *args, **user_kwargs):
        kwargs = {}
        kwargs['dimensions'] = 2
        kwargs['num_encoding_blocks'] = 5
        kwargs['out_channels_first_layer'] = 64
        kwargs.update(user_kwargs)
        super().__init__(*args, **kwargs)


loss_fn = torch.nn.BCEWithLogitsLoss()
unet_model = UNet2D(in_channels=3, out_classes=4, residual=True, num_encoding_blocks=2,
                    out_channels_first_layer=4).to(DEVICE)
optimizer = torch.optim.Adam(unet_model.parameters(), lr=1e-3)

for step in range(3):
    input = torch.randn(2, 3, 8, 8, device=DEVICE)
    targets = (torch.rand(2, 4, 8, 8, device=DEVICE) > 0.5).float()
    out = unet_model(input)
    loss = loss_fn(out, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
